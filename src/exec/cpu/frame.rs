//! Per-call scratch kept between calls: the buffer table, the kernel pointer table and the
//! storages of the temporaries, so that a steady stream of calls allocates almost nothing.
//!
//! A call takes a frame from its function's pool (or makes one when the pool is busy or
//! empty) and gives it back at the end, so several threads can call one function at once,
//! each with its own frame. A frame keeps one reference to the storage last used by each of
//! its slots (through a tensor never handed out); the storage is taken again only when that
//! reference is the only one left, that is when no live buffer of this call and no tensor
//! handed to a caller still uses it. A returned output is therefore never overwritten by a
//! later call. The one exception is a hand-over within a call: a kernel's result planned
//! over an operand that dies at that kernel takes the operand's storage
//! ([`Frame::handover`]). A slot whose holders are all done before the call's peak gives its
//! storage back after the last of them (`TempPlan::release_after`).

use crate::Result;
use crate::ir::dtype::DType;
use crate::runtime::Tensor;
use crate::runtime::layout::Layout;
use crate::runtime::storage::{ReadGuard, Storage, WriteGuard};
use std::sync::{Arc, Mutex};

/// Scratch of one call.
pub(super) struct Frame {
    /// The tensor of every buffer, by buffer id (all `None` between calls).
    pub bufs: Vec<Option<Tensor>>,
    /// Kernel argument table: the element pointer of every buffer a kernel touches.
    pub ptrs: Vec<*mut u8>,
    /// A tensor over the storage last used by each cached place (temporary slots, then
    /// direct GEMM results); never handed to a caller.
    pub cache: Vec<Option<Tensor>>,
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
    /// `dtype`, in a storage of `capacity` ≥ `len` elements unless `returned`): the kept
    /// storage when nothing else uses it any more, a new one otherwise.
    /// A buffer no output shows (`returned` false) gets the kept tensor itself when its
    /// layout fits, which allocates nothing.
    pub fn storage_tensor(
        &mut self,
        place: usize,
        dtype: DType,
        len: usize,
        capacity: usize,
        layout: &Layout,
        returned: bool,
    ) -> Result<Tensor> {
        // a caller's tensor holds a storage of its own size
        let capacity = if returned { len } else { capacity.max(len) };
        if let Some(t) = &self.cache[place]
            && t.dtype() == dtype
            && (t.storage().len() == len || (!returned && t.storage().len() >= len))
            && sole_owner(t)
        {
            if !returned && t.layout() == layout {
                return Ok(t.clone());
            }
            return Ok(Tensor::from_parts(t.storage_arc().clone(), layout.clone()));
        }
        let t = Tensor::from_parts(
            Arc::new(Storage::for_overwrite(dtype, capacity)?),
            layout.clone(),
        );
        let kept = if returned {
            Tensor::from_parts(t.storage_arc().clone(), layout.clone())
        } else {
            t.clone()
        };
        self.cache[place] = Some(kept);
        Ok(t)
    }

    /// A tensor of `layout` over the storage of cache place `place` for a buffer written
    /// over `over` (its operand, dying at this step, in the same place): when only the
    /// cache and `over` use that storage.
    pub fn handover(&self, place: usize, over: &Tensor, layout: &Layout) -> Option<Tensor> {
        let t = self.cache.get(place)?.as_ref()?;
        let storage = t.storage_arc();
        if !Arc::ptr_eq(storage, over.storage_arc()) || Arc::weak_count(storage) != 0 {
            return None;
        }
        let alone = if Arc::ptr_eq(&t.0, &over.0) {
            Arc::strong_count(&t.0) == 2 && Arc::strong_count(storage) == 1
        } else {
            Arc::strong_count(&t.0) == 1
                && Arc::strong_count(&over.0) == 1
                && Arc::strong_count(storage) == 2
        };
        alone.then(|| Tensor::from_parts(storage.clone(), layout.clone()))
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

/// Whether `t` (a frame's kept tensor) is the only handle on itself and its storage: then
/// no other thread can make a new one, and the storage is free for this call.
fn sole_owner(t: &Tensor) -> bool {
    Arc::strong_count(&t.0) == 1
        && Arc::weak_count(&t.0) == 0
        && Arc::strong_count(t.storage_arc()) == 1
        && Arc::weak_count(t.storage_arc()) == 0
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

/// Most storages one step locks without allocating.
pub(super) const MAX_LOCKS: usize = 8;

/// A held lock of either kind.
enum Guard<'a> {
    Read(#[allow(dead_code)] ReadGuard<'a>),
    Write(#[allow(dead_code)] WriteGuard<'a>),
}

/// Locks on a few storages, taken in storage-id order (the global lock order); a storage
/// asked for both reading and writing is locked once, for writing.
pub(super) struct Locks<'a> {
    // held only for their drop, which releases the locks
    _guards: [Option<Guard<'a>>; MAX_LOCKS],
}

impl<'a> Locks<'a> {
    /// Locks the distinct storages of `ts`, each for writing when any entry for it says so
    /// (at most `MAX_LOCKS` storages; `None` if more).
    pub fn lock(ts: impl IntoIterator<Item = (&'a Tensor, bool)>) -> Option<Locks<'a>> {
        let mut order: [Option<(&'a Storage, bool)>; MAX_LOCKS] = [None; MAX_LOCKS];
        let mut n = 0;
        for (t, write) in ts {
            let s = t.storage();
            if let Some(e) = order[..n].iter_mut().flatten().find(|x| x.0.id() == s.id()) {
                e.1 |= write;
                continue;
            }
            if n == MAX_LOCKS {
                return None;
            }
            order[n] = Some((s, write));
            n += 1;
        }
        order[..n].sort_unstable_by_key(|s| s.map_or(0, |(s, _)| s.id()));
        let mut guards: [Option<Guard<'a>>; MAX_LOCKS] = Default::default();
        for (g, e) in guards.iter_mut().zip(&order[..n]) {
            *g = e.map(|(s, write)| {
                if write {
                    Guard::Write(s.write())
                } else {
                    Guard::Read(s.read())
                }
            });
        }
        Some(Locks { _guards: guards })
    }
}
