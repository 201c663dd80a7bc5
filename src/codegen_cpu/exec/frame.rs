//! Per-call scratch kept between calls: the buffer table, the kernel pointer table and the
//! storages of the temporaries, so that a steady stream of calls allocates almost nothing.
//!
//! A call takes a frame from its function's pool (or makes one when the pool is busy or
//! empty) and gives it back at the end, so several threads can call one function at once,
//! each with its own frame. A frame keeps one reference to the storage last used by each of
//! its slots; the storage is taken again only when that reference is the only one left
//! (`Arc::get_mut`), that is when no live buffer of this call and no tensor handed to a
//! caller still uses it. A returned output is therefore never overwritten by a later call.

use crate::ir::dtype::DType;
use crate::runtime::Tensor;
use crate::runtime::layout::Layout;
use crate::runtime::storage::{ReadGuard, Storage};
use std::sync::{Arc, Mutex};

/// Scratch of one call.
pub(super) struct Frame {
    /// The tensor of every buffer, by buffer id (all `None` between calls).
    pub bufs: Vec<Option<Tensor>>,
    /// Kernel argument table: the element pointer of every buffer a kernel touches.
    pub ptrs: Vec<*mut u8>,
    /// The storage last used by each cached place (temporary slots, then direct GEMM
    /// results).
    pub cache: Vec<Option<Arc<Storage>>>,
    /// Caller tensors that buffers are written into instead of their own storage
    /// (`call_into`), by buffer id.
    pub into: Vec<Option<Tensor>>,
    /// Whether any entry of `into` is set.
    pub any_into: bool,
}

// SAFETY: between calls the pointer table holds stale addresses that are never read (each
// kernel call writes the entries it uses first); everything else is Send.
unsafe impl Send for Frame {}

impl Frame {
    fn new(buffers: usize, cached: usize) -> Frame {
        Frame {
            bufs: vec![None; buffers],
            ptrs: vec![std::ptr::null_mut(); buffers],
            cache: vec![None; cached],
            into: vec![None; buffers],
            any_into: false,
        }
    }

    /// A tensor of `layout` over the storage of cache place `place` (`len` elements of
    /// `dtype`): the kept storage when nothing else uses it any more, a new one otherwise.
    pub fn storage_tensor(
        &mut self,
        place: usize,
        dtype: DType,
        len: usize,
        layout: &Layout,
    ) -> Tensor {
        let kept = self.cache[place]
            .as_mut()
            .filter(|s| s.dtype() == dtype && s.len() == len)
            .and_then(|s| Arc::get_mut(s).is_some().then(|| s.clone()));
        let storage = kept.unwrap_or_else(|| {
            let s = Arc::new(Storage::for_overwrite(dtype, len));
            self.cache[place] = Some(s.clone());
            s
        });
        Tensor::from_parts(storage, layout.clone())
    }

    /// Drops every buffer's tensor (inputs included: a frame keeps no caller tensor alive).
    pub fn clear(&mut self) {
        for b in &mut self.bufs {
            *b = None;
        }
        if self.any_into {
            for b in &mut self.into {
                *b = None;
            }
            self.any_into = false;
        }
    }
}

/// The frames of one compiled function that no call is using.
pub(super) struct FramePool {
    free: Mutex<Vec<Frame>>,
    buffers: usize,
    cached: usize,
}

/// Frames kept at most (one per concurrent caller, up to this many).
const MAX_FRAMES: usize = 8;

impl FramePool {
    /// A pool for frames of `buffers` buffers and `cached` cache places.
    pub fn new(buffers: usize, cached: usize) -> FramePool {
        FramePool {
            free: Mutex::new(Vec::new()),
            buffers,
            cached,
        }
    }

    /// A free frame, or a new one when none is free or another thread holds the pool.
    pub fn take(&self) -> Frame {
        let kept = self.free.try_lock().ok().and_then(|mut f| f.pop());
        kept.unwrap_or_else(|| Frame::new(self.buffers, self.cached))
    }

    /// Gives a frame back after a call (cleared); dropped when the pool is busy or full.
    pub fn give(&self, mut frame: Frame) {
        frame.clear();
        if let Ok(mut free) = self.free.try_lock()
            && free.len() < MAX_FRAMES
        {
            free.push(frame);
        }
    }
}

/// Most storages one step read-locks without allocating.
pub(super) const MAX_LOCKS: usize = 8;

/// Read locks on a few storages, taken in storage-id order (the global lock order).
pub(super) struct ReadLocks<'a> {
    // held only for their drop, which releases the locks
    _guards: [Option<ReadGuard<'a>>; MAX_LOCKS],
}

impl<'a> ReadLocks<'a> {
    /// Locks the distinct storages of `ts` (at most `MAX_LOCKS` of them; `None` if more).
    pub fn lock(ts: impl IntoIterator<Item = &'a Tensor>) -> Option<ReadLocks<'a>> {
        let mut order: [Option<&'a Storage>; MAX_LOCKS] = [None; MAX_LOCKS];
        let mut n = 0;
        for t in ts {
            let s = t.storage();
            if order[..n].iter().flatten().any(|x| x.id() == s.id()) {
                continue;
            }
            if n == MAX_LOCKS {
                return None;
            }
            order[n] = Some(s);
            n += 1;
        }
        order[..n].sort_unstable_by_key(|s| s.map_or(0, Storage::id));
        let mut guards: [Option<ReadGuard<'a>>; MAX_LOCKS] = Default::default();
        for (g, s) in guards.iter_mut().zip(&order[..n]) {
            *g = s.map(Storage::read);
        }
        Some(ReadLocks { _guards: guards })
    }
}
