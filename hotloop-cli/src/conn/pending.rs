//! [`Pending`]: the client's bytes kept between reads, held only while
//! there are some.

/// Bytes of the client's kept apart from the read that brought them: a
/// request head split across reads, gathered, or what came behind a
/// request whose read buffer went back to the pool before its answer.
/// Every connection's future holds this, so it is one pointer (a `Vec`
/// would be 24 bytes), and the block exists only while it holds bytes:
/// an idle keep-alive connection holds no request buffer (nginx frees its
/// header buffers on keep-alive too). The usual request arrives in one
/// read and is parsed where the read put it, so this is never allocated
/// for it.
#[derive(Default)]
pub(crate) struct Pending(Option<Box<Block>>);

/// The bytes, of which the first `start` were taken already: taking
/// requests off the front moves no bytes (a pipelining client's requests
/// are taken one by one, each would move all behind it).
struct Block {
    bytes: Vec<u8>,
    start: usize,
}

impl Pending {
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        self.0.as_deref().map_or(&[], |b| &b.bytes[b.start..])
    }

    pub(crate) fn extend_from_slice(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let block = self.0.get_or_insert_with(|| Box::new(Block { bytes: Vec::new(), start: 0 }));
        if block.start > 0 {
            block.bytes.drain(..block.start);
            block.start = 0;
        }
        block.bytes.extend_from_slice(bytes);
    }

    /// Drops the first `len` bytes (a request that was answered); the
    /// block goes once none is left.
    pub(crate) fn consume(&mut self, len: usize) {
        if let Some(block) = &mut self.0 {
            block.start = (block.start + len).min(block.bytes.len());
            if block.start == block.bytes.len() {
                self.0 = None;
            }
        }
    }

    /// The capacity of the block, 0 without one (for tests).
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.0.as_ref().map_or(0, |b| b.bytes.capacity())
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
        assert!(p.bytes().iter().all(|&b| b == b'b'));
        p.consume(16_000);
        assert!(p.is_empty());
        assert_eq!(p.capacity(), 0);
        p.extend_from_slice(&[]);
        assert!(p.is_empty(), "nothing is allocated for no bytes");
    }

    /// Bytes added after some were taken follow those left.
    #[test]
    fn bytes_added_follow_those_left() {
        let mut p = Pending::default();
        p.extend_from_slice(b"GET /a\r\n\r\nGET /b");
        p.consume(10);
        assert_eq!(p.bytes(), b"GET /b");
        p.extend_from_slice(b"\r\n\r\n");
        assert_eq!(p.bytes(), b"GET /b\r\n\r\n");
    }
}
