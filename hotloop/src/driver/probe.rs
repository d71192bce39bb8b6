//! Probing the kernel for what the io_uring driver needs.

/// Ok if the io_uring driver can run here, else a sentence saying why not.
pub(crate) fn uring_support() -> Result<(), String> {
    Err("the io_uring driver is not available in this build".to_string())
}
