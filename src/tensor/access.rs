//! Taking the locks of several storages at once, always in storage-id order, so that two
//! threads doing in-place work on each other's inputs can never deadlock.

use super::Tensor;
use super::storage::{ReadGuard, Storage, WriteGuard};

// The guards are held only for their drop, which releases the locks.
#[allow(dead_code)]
enum Guard<'a> {
    Read(ReadGuard<'a>),
    Write(WriteGuard<'a>),
}

/// Locked storages with a pointer to the first element of each requested tensor.
pub struct Access<'a> {
    _guards: Vec<Guard<'a>>,
    reads: Vec<*const u8>,
    writes: Vec<*mut u8>,
}

impl Access<'_> {
    /// Pointer to element 0 of the i-th read tensor (its layout offset applied).
    pub fn read<T>(&self, i: usize) -> *const T {
        self.reads[i] as *const T
    }
    /// Pointer to element 0 of the i-th written tensor (its layout offset applied).
    pub fn write<T>(&self, i: usize) -> *mut T {
        self.writes[i] as *mut T
    }
}

/// Locks the storages of `reads` for reading and of `writes` for writing. A storage that is
/// both read and written is locked once, for writing; the kernel is then responsible for
/// the aliasing (elementwise kernels with identical layouts are fine).
pub fn lock<'a>(reads: &[&'a Tensor], writes: &[&'a Tensor]) -> Access<'a> {
    let mut all: Vec<(&'a Storage, bool)> = Vec::new();
    for (t, w) in reads
        .iter()
        .map(|t| (t, false))
        .chain(writes.iter().map(|t| (t, true)))
    {
        let s = t.storage();
        match all.iter_mut().find(|(x, _)| x.id() == s.id()) {
            Some(e) => e.1 |= w,
            None => all.push((s, w)),
        }
    }
    all.sort_by_key(|(s, _)| s.id());
    let mut guards = Vec::with_capacity(all.len());
    let mut base: Vec<(u64, *mut u8)> = Vec::with_capacity(all.len());
    for (s, w) in all {
        if w {
            let g = s.write();
            base.push((s.id(), g.ptr()));
            guards.push(Guard::Write(g));
        } else {
            let g = s.read();
            base.push((s.id(), g.ptr() as *mut u8));
            guards.push(Guard::Read(g));
        }
    }
    let ptr_of = |t: &Tensor| -> *mut u8 {
        let b = base
            .iter()
            .find(|(id, _)| *id == t.storage().id())
            .map(|(_, p)| *p)
            .unwrap_or(std::ptr::null_mut());
        // wrapping_add: an empty tensor's offset may point one past its (empty) buffer
        b.wrapping_add(t.layout().offset * t.dtype().size())
    };
    Access {
        reads: reads.iter().map(|t| ptr_of(t) as *const u8).collect(),
        writes: writes.iter().map(|t| ptr_of(t)).collect(),
        _guards: guards,
    }
}
