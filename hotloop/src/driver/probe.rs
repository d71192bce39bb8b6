//! Probing the kernel for what the io_uring driver needs.
//!
//! # Implementation notes
//! The probe asks the kernel rather than trusting a version number where it
//! can: it reads the `kernel.io_uring_disabled` sysctl, creates a small ring
//! (which is what seccomp filters and the sysctl actually block), checks the
//! ring's feature bits and asks `IORING_REGISTER_PROBE` for the socket
//! opcodes every connection needs (file opcodes are asked one by one,
//! [`opcode_supported`], where a file operation would use them).
//! Multishot accept is a flag on `IORING_OP_ACCEPT`, which
//! the opcode probe cannot see, so only that one is decided by the kernel
//! release (5.19 or later).
//!
//! The answer cannot change while the process runs, so it is computed once
//! and cached.

use std::io;
use std::sync::OnceLock;

use io_uring::{opcode, IoUring, Probe};

/// The first kernel release with multishot accept (`IORING_ACCEPT_MULTISHOT`).
pub(crate) const MULTISHOT_ACCEPT_SINCE: (u32, u32) = (5, 19);

/// Where the kernel says whether io_uring may be used (Linux 6.6+).
const IO_URING_DISABLED_PATH: &str = "/proc/sys/kernel/io_uring_disabled";

/// Ok if the io_uring driver can run here, else a sentence saying why not.
///
/// Probes once per process; later calls return the cached answer.
pub(crate) fn uring_support() -> Result<(), String> {
    static RESULT: OnceLock<Result<(), String>> = OnceLock::new();
    RESULT.get_or_init(probe).clone()
}

/// The first kernel release with multishot receive (`IORING_RECV_MULTISHOT`).
pub(crate) const MULTISHOT_RECV_SINCE: (u32, u32) = (6, 0);

/// True if the running kernel supports multishot receive with provided
/// buffer rings (and so multishot `RECVMSG` on datagram sockets).
pub(crate) fn multishot_recv_supported() -> bool {
    kernel_release().is_some_and(|r| r >= MULTISHOT_RECV_SINCE)
}

/// True if the running kernel supports multishot accept.
pub(crate) fn multishot_accept_supported() -> bool {
    kernel_release().is_some_and(|r| r >= MULTISHOT_ACCEPT_SINCE)
}

/// The first kernel release whose `SEND_ZC` reports whether it copied
/// (`IORING_SEND_ZC_REPORT_USAGE`).
pub(crate) const SEND_ZC_REPORT_USAGE_SINCE: (u32, u32) = (6, 2);

/// Ok if stream writes can go out as `SEND_ZC` with a report of whether
/// the kernel copied them, else a sentence saying why not. The flag is
/// not an opcode the probe can see, so it is decided by the release.
pub(crate) fn send_zc_support() -> Result<(), String> {
    if !opcode_supported(opcode::SendZc::CODE) {
        return Err("the kernel's io_uring lacks IORING_OP_SEND_ZC (Linux 6.0)".into());
    }
    if kernel_release().is_none_or(|r| r < SEND_ZC_REPORT_USAGE_SINCE) {
        return Err("the kernel's SEND_ZC cannot report whether it copied \
                    (IORING_SEND_ZC_REPORT_USAGE, Linux 6.2)"
            .into());
    }
    Ok(())
}

/// True if the kernel's io_uring has the opcode `code` (`IORING_REGISTER_PROBE`
/// on a small ring, asked once per process). False where io_uring cannot
/// run at all.
pub(crate) fn opcode_supported(code: u8) -> bool {
    static OPCODES: OnceLock<[bool; 256]> = OnceLock::new();
    OPCODES.get_or_init(|| {
        let mut supported = [false; 256];
        let Ok(ring) = IoUring::new(2) else { return supported };
        let mut probe = Probe::new();
        if ring.submitter().register_probe(&mut probe).is_ok() {
            for (code, slot) in supported.iter_mut().enumerate() {
                *slot = probe.is_supported(code as u8);
            }
        }
        supported
    })[usize::from(code)]
}

fn probe() -> Result<(), String> {
    let disabled = std::fs::read_to_string(IO_URING_DISABLED_PATH)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(0);
    if disabled == 2 {
        return Err("kernel.io_uring_disabled is 2, so io_uring is off for every process \
                    (`sysctl kernel.io_uring_disabled=0` turns it on)"
            .to_string());
    }
    let ring = match IoUring::new(8) {
        Ok(ring) => ring,
        Err(e) => return Err(setup_error_sentence(&e, disabled)),
    };
    let params = ring.params();
    if !params.is_feature_nodrop() {
        return Err(
            "io_uring lacks IORING_FEAT_NODROP (Linux 5.5+), so completions could be lost".into()
        );
    }
    if !params.is_feature_ext_arg() {
        return Err(
            "io_uring lacks IORING_FEAT_EXT_ARG (Linux 5.11+), needed for waits with a timeout"
                .into(),
        );
    }
    let mut probe = Probe::new();
    if let Err(e) = ring.submitter().register_probe(&mut probe) {
        return Err(format!("io_uring opcode probe failed ({e}); needs Linux 5.6+"));
    }
    let needed: [(u8, &str); 8] = [
        (opcode::Accept::CODE, "ACCEPT"),
        (opcode::Recv::CODE, "RECV"),
        (opcode::Send::CODE, "SEND"),
        (opcode::SendMsg::CODE, "SENDMSG"),
        (opcode::Connect::CODE, "CONNECT"),
        (opcode::Shutdown::CODE, "SHUTDOWN"),
        (opcode::AsyncCancel::CODE, "ASYNC_CANCEL"),
        (opcode::PollAdd::CODE, "POLL_ADD"),
    ];
    let missing: Vec<&str> = needed
        .iter()
        .filter(|(code, _)| !probe.is_supported(*code))
        .map(|(_, name)| *name)
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "the kernel's io_uring lacks IORING_OP_{} (Linux 5.11+ has every opcode hotloop uses)",
            missing.join(", IORING_OP_")
        ));
    }
    if !multishot_accept_supported() {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        return Err(format!(
            "kernel {} is older than {}.{}, which added multishot accept",
            release.trim(),
            MULTISHOT_ACCEPT_SINCE.0,
            MULTISHOT_ACCEPT_SINCE.1
        ));
    }
    Ok(())
}

/// A sentence a user can act on for a failed `io_uring_setup`.
fn setup_error_sentence(e: &io::Error, disabled: u32) -> String {
    match e.raw_os_error() {
        Some(libc::EPERM) if disabled == 1 => {
            "io_uring_setup: EPERM, kernel.io_uring_disabled is 1 and this \
                                               process is not in the kernel.io_uring_group group"
                .to_string()
        }
        Some(libc::EPERM) => {
            "io_uring_setup: EPERM, likely blocked by seccomp (container runtimes block io_uring by default) \
             or kernel.io_uring_disabled"
                .to_string()
        }
        Some(libc::ENOSYS) => "io_uring_setup: ENOSYS, the kernel was built without io_uring \
                               (CONFIG_IO_URING) or a seccomp filter hides it"
            .to_string(),
        Some(libc::ENOMEM) => {
            "io_uring_setup: ENOMEM, the locked-memory limit (ulimit -l) is too low for a ring".to_string()
        }
        _ => format!("io_uring_setup failed: {e}"),
    }
}

/// The running kernel's (major, minor) release, from `/proc/sys/kernel/osrelease`.
fn kernel_release() -> Option<(u32, u32)> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    parse_release(&release)
}

/// Parses "6.18.44-fc-v445" into (6, 18).
fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_releases() {
        assert_eq!(parse_release("6.18.44-fc-v445\n"), Some((6, 18)));
        assert_eq!(parse_release("5.19.0"), Some((5, 19)));
        assert_eq!(parse_release("4.4"), Some((4, 4)));
        assert_eq!(parse_release("garbage"), None);
    }

    #[test]
    fn setup_errors_become_sentences() {
        let eperm = io::Error::from_raw_os_error(libc::EPERM);
        assert!(setup_error_sentence(&eperm, 0)
            .starts_with("io_uring_setup: EPERM, likely blocked by seccomp"));
        assert!(setup_error_sentence(&eperm, 1).contains("kernel.io_uring_group"));
        let enosys = io::Error::from_raw_os_error(libc::ENOSYS);
        assert!(setup_error_sentence(&enosys, 0).contains("CONFIG_IO_URING"));
    }

    #[test]
    fn probe_is_cached_and_explains_itself() {
        let first = uring_support();
        assert_eq!(first, uring_support());
        if let Err(why) = first {
            assert!(!why.is_empty());
        }
    }
}
