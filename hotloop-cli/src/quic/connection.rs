//! Serving: each worker's accept loop, which admits or turns away every
//! connection attempt, and one connection's life (the handshake within its
//! limit, a slot once the address is validated, then echo or HTTP/3).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hotloop::time::timeout;
use quinn::{Endpoint, Incoming, VarInt};

use super::admission::{admit, Active, Admit, Admitted, Slot, Unvalidated};
use super::settings::{Proto, Settings, CLOSE_FULL_REASON, CLOSE_REASON};
use super::{echo, http3};
use crate::drain;

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

/// One connection: handshake within the limit, then the protocol. A
/// stop ends a handshake still in progress at once: the client is sent a
/// close ("server stopping"), and the drain does not wait out the limit
/// for a client that may never finish it.
pub(super) async fn connection(incoming: Incoming, admitted: Admitted, active: Active) {
    let settings = active.0.clone();
    let mut connecting = match incoming.accept() {
        Ok(connecting) => connecting,
        Err(_) => return abandoned(admitted, active).await,
    };
    let handshake = timeout(settings.handshake_timeout, drain::until_stop(&mut connecting)).await;
    let conn = match handshake {
        Ok(Some(Ok(conn))) => conn,
        Ok(None) => {
            // A server's side always converts (to 0.5-RTT), and a
            // `Connection` is what can be closed with a code and reason.
            if let Ok((conn, _)) = connecting.into_0rtt() {
                conn.close(VarInt::from_u32(settings.close_stopping()), CLOSE_REASON);
            }
            return abandoned(admitted, active).await;
        }
        // A failed handshake, or one past the limit (dropping it abandons the connection).
        _ => return abandoned(admitted, active).await,
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

/// A handshake that did not complete: the connection is no longer open,
/// and an unvalidated one's amplification limit stays a moment longer.
async fn abandoned(admitted: Admitted, active: Active) {
    if let Admitted::Unvalidated(place, limit) = admitted {
        drop((place, active));
        // quinn sends its close once the handshake is dropped: that
        // datagram too is held to the amplification limit.
        hotloop::time::sleep(AMPLIFICATION_LIMIT_LINGER).await;
        drop(limit);
    }
}
