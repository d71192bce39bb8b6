//! Serving: each worker's accept loop, which admits or turns away every
//! connection attempt, and one connection's life (the handshake within its
//! limit, a slot once the address is validated, then echo or HTTP/3).

use std::future::IntoFuture;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hotloop::time::timeout;
use quinn::{Endpoint, Incoming, VarInt};

use super::admission::{admit, Active, Admit, Admitted, Slot, Unvalidated};
use super::settings::{Proto, Settings, CLOSE_FULL_REASON};
use super::{echo, http3};

/// How long an abandoned unvalidated handshake's amplification limit stays
/// after it, while quinn sends the connection's close.
const AMPLIFICATION_LIMIT_LINGER: Duration = Duration::from_secs(1);

/// Takes the worker's incoming connections, each to a task of its own,
/// until the runtime ends; sends a Retry or refuses as [`admit`] says.
pub(super) async fn accept_loop(endpoint: Endpoint, settings: Arc<Settings>) {
    while let Some(incoming) = endpoint.accept().await {
        let admitted = match admit(&incoming, &settings) {
            Admit::Refuse => {
                settings.refused.fetch_add(1, Ordering::Relaxed);
                incoming.refuse();
                continue;
            }
            Admit::Retry => {
                settings.retries.fetch_add(1, Ordering::Relaxed);
                // `admit` sends a Retry only where quinn may.
                if let Err(e) = incoming.retry() {
                    e.into_incoming().refuse();
                }
                continue;
            }
            Admit::Slot => Admitted::Slot(Slot(settings.clone())),
            Admit::Unvalidated => {
                let pending = Unvalidated(settings.clone());
                match hotloop::quic::limit_amplification(&endpoint, incoming.remote_address()) {
                    Ok(limit) => Admitted::Unvalidated(pending, limit),
                    Err(_) => {
                        incoming.ignore();
                        continue;
                    }
                }
            }
        };
        let open = settings.active.fetch_add(1, Ordering::SeqCst) + 1;
        settings.peak.fetch_max(open, Ordering::Relaxed);
        settings.accepted.fetch_add(1, Ordering::Relaxed);
        let guard = Active(settings.clone());
        drop(hotloop::spawn(connection(incoming, admitted, guard)));
    }
}

/// One connection: handshake within the limit, then the protocol.
pub(super) async fn connection(incoming: Incoming, admitted: Admitted, active: Active) {
    let settings = active.0.clone();
    let conn = match timeout(settings.handshake_timeout, incoming.into_future()).await {
        Ok(Ok(conn)) => conn,
        // A failed handshake, or one past the limit (dropping it abandons the connection).
        _ => {
            if let Admitted::Unvalidated(place, limit) = admitted {
                drop((place, active));
                // quinn sends its close once the handshake is dropped: that
                // datagram too is held to the amplification limit.
                hotloop::time::sleep(AMPLIFICATION_LIMIT_LINGER).await;
                drop(limit);
            }
            return;
        }
    };
    // A completed handshake has validated the address: its place and its
    // amplification limit are given back, and it needs a slot now.
    let _slot = match admitted {
        Admitted::Slot(slot) => slot,
        Admitted::Unvalidated(place, limit) => {
            drop((place, limit));
            if !Settings::take(&settings.slots, settings.maxconn) {
                conn.close(VarInt::from_u32(settings.close_full), CLOSE_FULL_REASON);
                return;
            }
            Slot(settings.clone())
        }
    };
    match &settings.proto {
        Proto::Echo => echo::echo_connection(conn, &settings).await,
        Proto::H3 { body } => http3::h3_connection(conn, body, &settings).await,
    }
}
