//! Transmission-phase reply encoding: simple replies and structured reply chunks.
//!
//! Every function appends to `out`; data for READ replies is appended by the
//! caller right after the header these functions write, so large payloads are
//! never copied twice.

use crate::consts::*;
use crate::error::NbdError;
use crate::export::ExportInfo;
use crate::wire::{put_u16, put_u32, put_u64};

/// One `base:allocation` descriptor.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Extent {
    pub length: u32,
    /// `STATE_HOLE` | `STATE_ZERO`, or 0 for allocated data.
    pub flags: u32,
}

/// Simple reply header (16 bytes). For a successful READ the caller appends the
/// `length` bytes of data.
pub fn simple_reply(out: &mut Vec<u8>, handle: u64, error: u32) {
    put_u32(out, SIMPLE_REPLY_MAGIC);
    put_u32(out, error);
    put_u64(out, handle);
}

/// Structured reply chunk header (20 bytes); `length` bytes of payload follow.
pub fn chunk_header(out: &mut Vec<u8>, flags: u16, reply_type: u16, handle: u64, length: u32) {
    put_u32(out, STRUCTURED_REPLY_MAGIC);
    put_u16(out, flags);
    put_u16(out, reply_type);
    put_u64(out, handle);
    put_u32(out, length);
}

fn done_flag(done: bool) -> u16 {
    if done { REPLY_FLAG_DONE } else { 0 }
}

/// `NBD_REPLY_TYPE_NONE` with DONE: the request succeeded (or its earlier error
/// chunks stand).
pub fn none_chunk(out: &mut Vec<u8>, handle: u64) {
    chunk_header(out, REPLY_FLAG_DONE, REPLY_TYPE_NONE, handle, 0);
}

/// `NBD_REPLY_TYPE_OFFSET_DATA` header and offset; the caller appends `data_len`
/// (≥ 1) bytes of data.
pub fn offset_data_header(out: &mut Vec<u8>, handle: u64, offset: u64, data_len: u32, done: bool) {
    debug_assert!(data_len > 0 && data_len <= u32::MAX - 8);
    chunk_header(
        out,
        done_flag(done),
        REPLY_TYPE_OFFSET_DATA,
        handle,
        data_len.saturating_add(8),
    );
    put_u64(out, offset);
}

/// `NBD_REPLY_TYPE_OFFSET_HOLE`: `hole_len` (≥ 1) bytes at `offset` read as zeroes.
pub fn offset_hole(out: &mut Vec<u8>, handle: u64, offset: u64, hole_len: u32, done: bool) {
    chunk_header(out, done_flag(done), REPLY_TYPE_OFFSET_HOLE, handle, 12);
    put_u64(out, offset);
    put_u32(out, hole_len);
}

fn clipped_message(message: &str) -> &[u8] {
    let mut end = message.len().min(MAX_STRING_LEN);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message.as_bytes()[..end]
}

/// `NBD_REPLY_TYPE_ERROR` with a human-readable message (clipped to 4096 bytes).
pub fn error_chunk(out: &mut Vec<u8>, handle: u64, error: &NbdError, done: bool) {
    let msg = clipped_message(&error.message);
    chunk_header(
        out,
        done_flag(done),
        REPLY_TYPE_ERROR,
        handle,
        6 + msg.len() as u32,
    );
    put_u32(out, error.code.to_wire());
    put_u16(out, msg.len() as u16);
    out.extend_from_slice(msg);
}

/// `NBD_REPLY_TYPE_ERROR_OFFSET`: an error at `offset` (inside the request).
pub fn error_offset_chunk(
    out: &mut Vec<u8>,
    handle: u64,
    error: &NbdError,
    offset: u64,
    done: bool,
) {
    let msg = clipped_message(&error.message);
    chunk_header(
        out,
        done_flag(done),
        REPLY_TYPE_ERROR_OFFSET,
        handle,
        14 + msg.len() as u32,
    );
    put_u32(out, error.code.to_wire());
    put_u16(out, msg.len() as u16);
    out.extend_from_slice(msg);
    put_u64(out, offset);
}

/// `NBD_REPLY_TYPE_BLOCK_STATUS` for one context, shaped to the request:
/// zero-length extents dropped, at most one extent with `req_one`, descriptors
/// stopped once they cover `requested_length` and the last one clipped to it.
/// With nothing usable, one descriptor of status 0 (always safe) is sent.
pub fn block_status_chunk(
    out: &mut Vec<u8>,
    handle: u64,
    context_id: u32,
    extents: &[Extent],
    req_one: bool,
    requested_length: u32,
    done: bool,
) {
    let mut shaped: Vec<Extent> = Vec::new();
    let mut covered: u64 = 0;
    for e in extents.iter().filter(|e| e.length > 0) {
        if covered >= requested_length as u64 || (req_one && !shaped.is_empty()) {
            break;
        }
        let room = requested_length as u64 - covered;
        let length = (e.length as u64).min(room) as u32;
        covered += length as u64;
        shaped.push(Extent {
            length,
            flags: e.flags,
        });
    }
    if shaped.is_empty() {
        shaped.push(Extent {
            length: requested_length.max(1),
            flags: 0,
        });
    }
    chunk_header(
        out,
        done_flag(done),
        REPLY_TYPE_BLOCK_STATUS,
        handle,
        4 + 8 * shaped.len() as u32,
    );
    put_u32(out, context_id);
    for e in shaped {
        put_u32(out, e.length);
        put_u32(out, e.flags);
    }
}

/// Reply to a request that failed: a structured error chunk when structured
/// replies were negotiated (mandatory for READ, and it carries the message),
/// a simple reply otherwise.
pub fn error_reply(out: &mut Vec<u8>, export: &ExportInfo, handle: u64, error: &NbdError) {
    if export.structured_replies {
        error_chunk(out, handle, error, true);
    } else {
        simple_reply(out, handle, error.code.to_wire());
    }
}

/// Reply to a successful request that returns no data (anything but READ and
/// BLOCK_STATUS). A simple reply is valid whether or not structured replies
/// were negotiated.
pub fn ok_reply(out: &mut Vec<u8>, handle: u64) {
    simple_reply(out, handle, 0);
}

/// Header for a successful READ of `data_len` bytes at `offset`; the caller
/// appends exactly `data_len` bytes after it.
pub fn read_reply_header(
    out: &mut Vec<u8>,
    export: &ExportInfo,
    handle: u64,
    offset: u64,
    data_len: u32,
) {
    if !export.structured_replies {
        simple_reply(out, handle, 0);
    } else if data_len == 0 {
        none_chunk(out, handle);
    } else {
        offset_data_header(out, handle, offset, data_len, true);
    }
}

/// A whole successful READ reply.
pub fn read_reply(out: &mut Vec<u8>, export: &ExportInfo, handle: u64, offset: u64, data: &[u8]) {
    read_reply_header(out, export, handle, offset, data.len() as u32);
    out.extend_from_slice(data);
}
