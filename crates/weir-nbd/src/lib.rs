//! # weir-nbd — the NBD wire protocol on byte buffers
//!
//! Server and client side of the NBD protocol as specified in `doc/proto.md` of
//! the NetworkBlockDevice/nbd project: fixed newstyle handshake (NO_ZEROES,
//! EXPORT_NAME, LIST, INFO, GO, ABORT, STRUCTURED_REPLY, LIST/SET_META_CONTEXT
//! with `base:allocation`; STARTTLS as an option, the TLS itself is the
//! server's), request decoding and validation, simple and structured replies.
//! No sockets, no files, no clocks: every state machine takes bytes in and gives
//! bytes (and events) out, so it can be fuzzed and driven by tokio or a test
//! alike.
//!
//! Server flow: [`ServerHandshake`] until [`HandshakeEvent::ExportChosen`], then
//! per request [`RequestHeader::decode`] (or [`RequestDecoder`]), [`validate`],
//! storage, and a reply from [`reply`]. Client flow: [`ClientHandshake`], then
//! [`ClientSession`].

pub mod client;
pub mod consts;
pub mod error;
pub mod export;
pub mod fuzz;
pub mod reply;
pub mod request;
pub mod server;
mod wire;

pub use client::{
    ClientConfig, ClientExport, ClientGoal, ClientHandshake, ClientOutcome, ClientSession,
    Completion, ReplyData,
};
pub use error::{ErrorCode, NbdError, ProtocolError};
pub use export::{BlockSize, ExportCatalog, ExportDescription, ExportInfo, ExportListing};
pub use reply::Extent;
pub use request::{Command, Request, RequestDecoder, RequestHeader, ValidRequest, validate};
pub use server::{
    BASE_ALLOCATION_ID, HandshakeEvent, LEASE_CONTEXT_ID, ServerHandshake, TlsPolicy, printable,
    valid_lease_token,
};
