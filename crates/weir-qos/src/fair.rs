//! One volume's queue: a FIFO per client (host or VM), served by start-time fair
//! queueing in cost units, so the clients of a volume split what the volume is
//! released fairly — whatever their queue depths and request sizes — instead of
//! first come, first served (a host at QD32 would otherwise take 32/36 of a limit
//! shared with a host at QD4).
//!
//! A request may leave in **pieces**: when the scheduler asks for a piece of at
//! most `max_piece_bytes`, a larger request gives its next piece and stays at the
//! head of its client's FIFO. Pieces are how a large request is paced under a limit
//! (a 32 MiB read under 1,000 IOPS leaves as 20 KiB pieces spaced by the limit,
//! never as 32 MiB in one second).

use std::collections::VecDeque;

use crate::{ClientId, Nanos};

/// Where a released piece lies: absolute offset and length (bytes) on the volume,
/// and whether it is the request's last.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    pub offset: u64,
    pub length: u32,
    pub last: bool,
}

impl Piece {
    /// A request that leaves whole.
    pub fn whole(offset: u64, length: u32) -> Piece {
        Piece {
            offset,
            length,
            last: true,
        }
    }
}

/// One queued request (or what is left of it).
#[derive(Debug)]
pub(crate) struct Queued<T> {
    pub kind: crate::IoKind,
    /// Start of the next piece.
    pub offset: u64,
    /// Bytes not released yet.
    pub remaining: u32,
    /// `Some`: the request may be released in pieces (each piece gets a copy of the
    /// payload, the last one the payload itself).
    pub split: Option<fn(&T) -> T>,
    pub enqueued_at: Nanos,
    pub payload: T,
}

#[derive(Debug)]
struct SubQueue<T> {
    client: ClientId,
    items: VecDeque<Queued<T>>,
    /// SFQ finish tag of the client's last release (cost units). Kept while the
    /// client's FIFO is empty until the virtual time passes it: a client that
    /// empties its queue between requests (QD1) pays for what it got when it
    /// comes back (`start = max(finish, vtime)`), instead of starting afresh.
    finish: u128,
}

/// The fair multi-queue of one volume.
#[derive(Debug)]
pub(crate) struct VolumeQueue<T> {
    subs: Vec<SubQueue<T>>,
    /// Index in `subs` of the client served next (valid while non-empty).
    head: usize,
    /// Requests queued (a request in pieces counts once until its last piece).
    len: usize,
    /// SFQ virtual time: the start tag of the last release.
    vtime: u128,
}

impl<T> Default for VolumeQueue<T> {
    fn default() -> Self {
        VolumeQueue {
            subs: Vec::new(),
            head: 0,
            len: 0,
            vtime: 0,
        }
    }
}

impl<T> VolumeQueue<T> {
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn push_back(&mut self, client: ClientId, item: Queued<T>) {
        match self.subs.iter_mut().find(|s| s.client == client) {
            Some(s) => s.items.push_back(item),
            None => {
                // Forget idle clients whose finish tag the virtual time has passed
                // (they would start at the virtual time anyway).
                let vtime = self.vtime;
                self.subs
                    .retain(|s| !s.items.is_empty() || s.finish > vtime);
                self.subs.push(SubQueue {
                    client,
                    items: VecDeque::from([item]),
                    finish: vtime,
                })
            }
        }
        self.len += 1;
        self.pick_head();
    }

    /// When the oldest queued request arrived (the one whose wait puts a latency
    /// target at risk, whichever client it belongs to).
    pub fn oldest_enqueued_at(&self) -> Option<Nanos> {
        self.subs
            .iter()
            .filter_map(|s| s.items.front().map(|q| q.enqueued_at))
            .min()
    }

    /// Takes the next piece of the head request: at most `max_piece(kind)` bytes when
    /// the request may be split and that is less than what is left (0: whole).
    /// `units_of(kind, bytes)` is what the piece costs (cost units) for fairness.
    pub fn take(
        &mut self,
        max_piece: impl Fn(crate::IoKind) -> u32,
        units_of: impl Fn(crate::IoKind, u32) -> u64,
    ) -> Option<(ClientId, Piece, crate::IoKind, Nanos, T)> {
        let s = self.subs.get_mut(self.head)?;
        let client = s.client;
        let start = s.finish.max(self.vtime);
        let head = s.items.front_mut()?;
        let max_piece_bytes = max_piece(head.kind);
        let carve = head
            .split
            .filter(|_| max_piece_bytes > 0 && head.remaining > max_piece_bytes);
        let out = match carve {
            Some(copy) => {
                let piece = Piece {
                    offset: head.offset,
                    length: max_piece_bytes,
                    last: false,
                };
                head.offset += max_piece_bytes as u64;
                head.remaining -= max_piece_bytes;
                let payload = copy(&head.payload);
                (client, piece, head.kind, head.enqueued_at, payload)
            }
            None => {
                let q = s.items.pop_front()?;
                self.len -= 1;
                let piece = Piece::whole(q.offset, q.remaining);
                (client, piece, q.kind, q.enqueued_at, q.payload)
            }
        };
        let s = &mut self.subs[self.head];
        s.finish = start + units_of(out.2, out.1.length).max(1) as u128;
        self.vtime = start;
        self.pick_head();
        Some(out)
    }

    /// Chooses the backlogged client with the smallest start tag (ties: the
    /// earlier client).
    fn pick_head(&mut self) {
        let vtime = self.vtime;
        self.head = self
            .subs
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.items.is_empty())
            .min_by_key(|(i, s)| (s.finish.max(vtime), *i))
            .map_or(0, |(i, _)| i);
    }

    /// Every queued payload, oldest client first (the volume is going away).
    pub fn drain(self) -> impl Iterator<Item = T> {
        self.subs
            .into_iter()
            .flat_map(|s| s.items.into_iter().map(|q| q.payload))
    }

    /// Takes the queued requests for which `pred` holds (the others stay).
    pub fn extract(&mut self, mut pred: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut out = Vec::new();
        for s in &mut self.subs {
            let (gone, kept): (VecDeque<_>, VecDeque<_>) =
                s.items.drain(..).partition(|q| pred(&q.payload));
            s.items = kept;
            out.extend(gone.into_iter().map(|q| q.payload));
        }
        self.len -= out.len();
        self.pick_head();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IoKind;

    fn item(offset: u64, len: u32, at: Nanos, payload: u32) -> Queued<u32> {
        Queued {
            kind: IoKind::Read,
            offset,
            remaining: len,
            split: Some(|p| *p),
            enqueued_at: at,
            payload,
        }
    }

    fn units(_: IoKind, bytes: u32) -> u64 {
        (bytes as u64).div_ceil(4096)
    }

    #[test]
    fn clients_split_units_fairly_whatever_their_depth() {
        let mut q = VolumeQueue::default();
        for i in 0..32 {
            q.push_back(ClientId(1), item(i * 4096, 4096, 0, 1));
        }
        for i in 0..4 {
            q.push_back(ClientId(2), item(i * 4096, 4096, 0, 2));
        }
        let first: Vec<u32> = (0..8).map(|_| q.take(|_| 0, units).unwrap().4).collect();
        assert_eq!(first, [1, 2, 1, 2, 1, 2, 1, 2]);
        assert_eq!(q.len(), 28);
    }

    #[test]
    fn a_large_request_leaves_in_pieces_interleaved_with_small_ones() {
        let mut q = VolumeQueue::default();
        q.push_back(ClientId(1), item(1 << 20, 32 << 20, 0, 1));
        q.push_back(ClientId(2), item(0, 4096, 5, 2));
        q.push_back(ClientId(2), item(4096, 4096, 6, 2));
        assert_eq!(q.oldest_enqueued_at(), Some(0));
        let (c, p, ..) = q.take(|_| 20480, units).unwrap();
        assert_eq!(
            (c, p.offset, p.length, p.last),
            (ClientId(1), 1 << 20, 20480, false)
        );
        // The small reader is next (its start tag is behind the 5 units just charged).
        let (c, p, ..) = q.take(|_| 20480, units).unwrap();
        assert_eq!((c, p.length, p.last), (ClientId(2), 4096, true));
        // Client 1's second piece continues where the first ended.
        let got: Vec<(u32, u64)> = (0..3)
            .map(|_| {
                let (c, p, ..) = q.take(|_| 20480, units).unwrap();
                (c.0, p.offset)
            })
            .collect();
        assert_eq!(got[0], (2, 4096));
        assert_eq!(got[1], (1, (1 << 20) + 20480));
        // The request counts as queued until its last piece leaves.
        assert_eq!(q.len(), 1);
        let mut total = 3 * 20480u64;
        loop {
            let (_, p, ..) = q.take(|_| 20480, units).unwrap();
            total += p.length as u64;
            if p.last {
                break;
            }
        }
        assert_eq!(total, 32 << 20);
        assert!(q.is_empty());
    }

    #[test]
    fn a_client_that_empties_its_queue_pays_for_what_it_got() {
        // Client 1: one 32 MiB request in 5-unit pieces; client 2: QD1 4 KiB reads,
        // each issued after the previous one left (its FIFO empties every time).
        let mut q = VolumeQueue::default();
        q.push_back(ClientId(1), item(0, 32 << 20, 0, 1));
        let mut got = [0u64; 3];
        for _ in 0..1000 {
            if q.len() == 1 {
                q.push_back(ClientId(2), item(0, 4096, 0, 2));
            }
            let (c, p, ..) = q.take(|_| 20480, units).unwrap();
            got[c.0 as usize] += (p.length as u64).div_ceil(4096);
        }
        // Equal units while both are backlogged: not 1 piece per small read.
        let ratio = got[1] as f64 / got[2] as f64;
        assert!((0.9..1.1).contains(&ratio), "units {got:?}");
    }

    #[test]
    fn requests_that_may_not_split_leave_whole() {
        let mut q: VolumeQueue<u32> = VolumeQueue::default();
        q.push_back(
            ClientId(1),
            Queued {
                split: None,
                ..item(0, 1 << 20, 0, 9)
            },
        );
        let (_, p, ..) = q.take(|_| 4096, units).unwrap();
        assert_eq!(p, Piece::whole(0, 1 << 20));
        let mut q = VolumeQueue::default();
        q.push_back(ClientId(1), item(0, 4096, 0, 1));
        q.push_back(ClientId(2), item(0, 4096, 0, 2));
        q.push_back(ClientId(1), item(0, 4096, 0, 3));
        assert_eq!(q.extract(|p| *p != 2), vec![1, 3]);
        assert_eq!(q.len(), 1);
        assert_eq!(q.drain().collect::<Vec<_>>(), vec![2]);
    }
}
