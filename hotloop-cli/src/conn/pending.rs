//! [`Pending`]: the bytes of a request head split across reads, held only
//! while a head is incomplete.

/// Bytes of a request split across reads, gathered. Every connection's
/// future holds this, so it is one pointer (a `Vec` would be 24 bytes),
/// and the block exists only while it holds bytes: an idle keep-alive
/// connection holds no request buffer (nginx frees its header buffers on
/// keep-alive too). The usual request arrives in one read and is parsed
/// where the read put it, so this is never allocated for it.
#[derive(Default)]
#[allow(clippy::box_collection)]
pub(crate) struct Pending(Option<Box<Vec<u8>>>);

impl Pending {
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        self.0.as_deref().map_or(&[], Vec::as_slice)
    }

    pub(crate) fn extend_from_slice(&mut self, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.0.get_or_insert_with(Box::default).extend_from_slice(bytes);
        }
    }

    /// Drops the first `len` bytes (a request that was answered); the
    /// block goes once none is left.
    pub(crate) fn consume(&mut self, len: usize) {
        if let Some(v) = &mut self.0 {
            v.drain(..len);
            if v.is_empty() {
                self.0 = None;
            }
        }
    }

    /// The capacity of the block, 0 without one (for tests).
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.0.as_ref().map_or(0, |v| v.capacity())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answering the last whole request frees the block, however large
    /// the head that grew it.
    #[test]
    fn the_block_goes_with_its_last_byte() {
        let mut p = Pending::default();
        assert_eq!(p.capacity(), 0);
        p.extend_from_slice(&[b'a'; 8000]);
        p.extend_from_slice(&[b'b'; 16000]);
        assert!(p.capacity() >= 24_000);
        p.consume(8000);
        assert_eq!(p.bytes().len(), 16_000);
        p.consume(16_000);
        assert!(p.is_empty());
        assert_eq!(p.capacity(), 0);
        p.extend_from_slice(&[]);
        assert!(p.is_empty(), "nothing is allocated for no bytes");
    }
}
