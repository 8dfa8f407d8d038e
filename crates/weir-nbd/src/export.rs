//! What the caller tells the protocol about an export, and what a finished
//! handshake agreed on.

use crate::consts::*;

/// Block size constraints advertised with `NBD_INFO_BLOCK_SIZE`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct BlockSize {
    /// Smallest addressable unit and alignment (power of two, ≤ 64 KiB).
    pub min_bytes: u32,
    /// Size at which aligned I/O is efficient (power of two, ≥ 512).
    pub preferred_bytes: u32,
    /// Largest READ/WRITE/CACHE length accepted in one request.
    pub max_payload_bytes: u32,
}

impl Default for BlockSize {
    fn default() -> Self {
        BlockSize {
            min_bytes: 1,
            preferred_bytes: 4096,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD,
        }
    }
}

impl BlockSize {
    /// Checks the constraints `proto.md` puts on advertised values.
    pub fn validate(&self) -> Result<(), String> {
        let pow2 = |v: u32| v != 0 && v.is_power_of_two();
        if !pow2(self.min_bytes) || self.min_bytes > 65536 {
            return Err(format!(
                "minimum block size {} must be a power of two ≤ 65536",
                self.min_bytes
            ));
        }
        if !pow2(self.preferred_bytes) || self.preferred_bytes < self.min_bytes.max(512) {
            return Err(format!(
                "preferred block size {} must be a power of two ≥ max(minimum, 512)",
                self.preferred_bytes
            ));
        }
        if self.max_payload_bytes != u32::MAX
            && (!self.max_payload_bytes.is_multiple_of(self.min_bytes)
                || self.max_payload_bytes < self.preferred_bytes)
        {
            return Err(format!(
                "maximum block size {} must be a multiple of the minimum and ≥ the preferred size",
                self.max_payload_bytes
            ));
        }
        Ok(())
    }
}

/// An export as the caller (the server's volume layer) describes it for one client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportDescription {
    /// Canonical name (what `NBD_OPT_LIST` shows).
    pub name: String,
    /// Human-readable description (empty: none).
    pub description: String,
    pub size_bytes: u64,
    pub read_only: bool,
    /// Set only when FLUSH/FUA effects are visible across connections.
    pub can_multi_conn: bool,
    pub rotational: bool,
    pub block_size: BlockSize,
}

impl ExportDescription {
    pub fn new(name: impl Into<String>, size_bytes: u64) -> ExportDescription {
        ExportDescription {
            name: name.into(),
            description: String::new(),
            size_bytes,
            read_only: false,
            can_multi_conn: false,
            rotational: false,
            block_size: BlockSize::default(),
        }
    }

    /// Transmission flags for this export; `NBD_FLAG_SEND_DF` only when structured
    /// replies were negotiated.
    pub fn transmission_flags(&self, structured_replies: bool) -> u16 {
        let mut flags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_SEND_CACHE;
        if self.read_only {
            // As qemu-nbd -r: no TRIM or WRITE_ZEROES to offer (they would get EPERM).
            flags |= FLAG_READ_ONLY;
        } else {
            flags |= FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO;
        }
        if self.can_multi_conn {
            flags |= FLAG_CAN_MULTI_CONN;
        }
        if self.rotational {
            flags |= FLAG_ROTATIONAL;
        }
        if structured_replies {
            flags |= FLAG_SEND_DF;
        }
        flags
    }
}

/// One line of `NBD_OPT_LIST`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportListing {
    pub name: String,
    pub description: String,
}

/// The caller's view of the exports one connection may see (host access groups
/// are applied here: an export the client may not open is simply not there).
pub trait ExportCatalog {
    /// Exports shown to `NBD_OPT_LIST`.
    fn list(&self) -> Vec<ExportListing>;
    /// The export `name` (empty: the default export, if any), or `None` when it does
    /// not exist or this client may not see it.
    fn lookup(&self, name: &str) -> Option<ExportDescription>;
    /// Whether the exclusive-writer lease `token` may be granted on `export` now
    /// (`weir:exclusive=TOKEN`). Catalogs without leases grant none.
    fn lease_available(&self, _export: &str, _token: &str) -> bool {
        false
    }
}

/// A fixed list of exports (tests, single-export tools).
impl ExportCatalog for [ExportDescription] {
    fn list(&self) -> Vec<ExportListing> {
        self.iter()
            .map(|e| ExportListing {
                name: e.name.clone(),
                description: e.description.clone(),
            })
            .collect()
    }
    fn lookup(&self, name: &str) -> Option<ExportDescription> {
        self.iter().find(|e| e.name == name).cloned()
    }
}

impl ExportCatalog for Vec<ExportDescription> {
    fn list(&self) -> Vec<ExportListing> {
        self.as_slice().list()
    }
    fn lookup(&self, name: &str) -> Option<ExportDescription> {
        self.as_slice().lookup(name)
    }
}

/// What the handshake agreed on: everything transmission needs to validate and
/// answer requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportInfo {
    pub name: String,
    pub size_bytes: u64,
    pub transmission_flags: u16,
    pub structured_replies: bool,
    /// Context id of `base:allocation` when it was selected for this export.
    pub base_allocation_id: Option<u32>,
    pub block_size: BlockSize,
    /// The token of a `weir:exclusive=TOKEN` lease the server agreed to grant
    /// (its context id is [`crate::LEASE_CONTEXT_ID`]); the server takes it when
    /// transmission starts.
    pub exclusive_lease: Option<String>,
}

impl ExportInfo {
    pub fn read_only(&self) -> bool {
        self.transmission_flags & FLAG_READ_ONLY != 0
    }
    pub fn has_flag(&self, flag: u16) -> bool {
        self.transmission_flags & flag != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_only_export_offers_no_trim_or_zeroing() {
        let mut d = ExportDescription::new("a", 1 << 20);
        let rw = d.transmission_flags(true);
        let writes = FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO;
        assert_eq!(rw & writes, writes);
        assert_eq!(rw & FLAG_READ_ONLY, 0);
        d.read_only = true;
        let ro = d.transmission_flags(true);
        assert_eq!(ro & writes, 0);
        assert_ne!(ro & FLAG_READ_ONLY, 0);
        assert_eq!(
            ro & (FLAG_SEND_FLUSH | FLAG_SEND_CACHE | FLAG_SEND_DF),
            rw & (FLAG_SEND_FLUSH | FLAG_SEND_CACHE | FLAG_SEND_DF)
        );
    }
}
