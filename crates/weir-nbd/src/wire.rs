//! Big-endian readers and writers over byte slices; every read is bounds-checked.

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    pub(crate) fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.remaining() < n {
            return None;
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Some(s)
    }
    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.bytes(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.bytes(4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.bytes(8).map(|b| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_be_bytes(a)
        })
    }
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }
}

pub(crate) fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_be_bytes());
}
pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}
pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_be_bytes());
}

/// Checks a protocol string: valid UTF-8, no NUL, at most 4096 bytes.
pub(crate) fn parse_string(bytes: &[u8]) -> Result<String, &'static str> {
    if bytes.len() > crate::consts::MAX_STRING_LEN {
        return Err("string longer than 4096 bytes");
    }
    if bytes.contains(&0) {
        return Err("string contains NUL");
    }
    std::str::from_utf8(bytes)
        .map(str::to_owned)
        .map_err(|_| "string is not valid UTF-8")
}

/// A byte buffer consumed from the front, compacted lazily.
#[derive(Default, Debug)]
pub(crate) struct InBuf {
    data: Vec<u8>,
    start: usize,
}

impl InBuf {
    pub(crate) fn extend(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.data.len() {
            self.data.clear();
            self.start = 0;
        } else if self.start > 64 * 1024 && self.start * 2 > self.data.len() {
            self.data.drain(..self.start);
            self.start = 0;
        }
        self.data.extend_from_slice(bytes);
    }
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.data[self.start..]
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub(crate) fn len(&self) -> usize {
        self.data.len() - self.start
    }
    pub(crate) fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.data.len());
    }
    pub(crate) fn take_all(&mut self) -> Vec<u8> {
        let v = self.as_slice().to_vec();
        self.data.clear();
        self.start = 0;
        v
    }
}
