//! The tensor core: `Tensor`, shared storage seen through a layout, with what needs no
//! kernel: its attributes, its storage and the locks on it, element types, strided walks,
//! the thread pool and the hooks. Cloning a tensor is cheap and shares data. Ops on tensors
//! (`runtime::apply`, the methods in `runtime::ops`) and the kernels sit on floors above.

pub mod access;
pub mod element;
pub mod hooks;
pub mod limit;
mod pages;
pub mod storage;
pub mod strided;
pub mod threads;

use self::element::Element;
use self::storage::Storage;
use crate::device::Device;
use crate::ir::dtype::{DType, Scalar};
use crate::ir::op::TensorType;
use crate::ir::shape::{checked_numel, numel};
use crate::layout::Layout;
use crate::{Result, bail};
use std::sync::Arc;

/// An n-dimensional array: a view (layout) of shared storage, PyTorch's `torch.Tensor`. Cloning
/// shares the data.
#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<Inner>);

/// A size argument, PyTorch's int: `i64`, `i32` or `usize`, so that shapes read from a
/// tensor (`usize`) and literals with `-1` both work: `x.view(&[n, 1])`, `x.view(&[2, -1])`.
/// Bare literals are `i32`s: write sizes of 2³¹ or more as `i64` (`1i64 << 31`).
pub trait Dim: Copy {
    /// The value as i64.
    fn to_i64(self) -> i64;
}

impl Dim for i64 {
    fn to_i64(self) -> i64 {
        self
    }
}

impl Dim for i32 {
    fn to_i64(self) -> i64 {
        self.into()
    }
}

impl Dim for usize {
    /// Sizes past `i64::MAX` saturate, and the shape rule then refuses them.
    fn to_i64(self) -> i64 {
        i64::try_from(self).unwrap_or(i64::MAX)
    }
}

pub(crate) struct Inner {
    storage: Arc<Storage>,
    layout: Layout,
    /// A Python-style number (`&t * 0.5`): lowest priority in type promotion.
    wrapped: bool,
    /// Gradient bookkeeping (`requires_grad`, `.grad`, the recording that made it).
    pub(crate) autograd: std::sync::Mutex<AutogradMeta>,
}

/// Per-tensor gradient state, as PyTorch keeps it on every tensor. The runtime only holds
/// it; `autograd` reads and writes it (the node it records is opaque down here).
#[derive(Default)]
pub(crate) struct AutogradMeta {
    /// Gradients flow to this tensor.
    pub requires_grad: bool,
    /// The accumulated gradient (`.grad`).
    pub grad: Option<Tensor>,
    /// The recorded op that produced this tensor (autograd's node); `None` for leaves.
    pub grad_fn: Option<Arc<dyn std::any::Any + Send + Sync>>,
    /// Called after a gradient is accumulated into `.grad` (a leaf's
    /// `register_post_accumulate_grad_hook`).
    pub post_accumulate: Vec<PostAccumulateHook>,
}

/// A hook run with a leaf after its `.grad` was accumulated; its error ends the backward.
pub type PostAccumulateHook = Arc<dyn Fn(&Tensor) -> crate::Result<()> + Send + Sync>;

impl Tensor {
    /// A tensor over `storage` seen through `layout`. The layout must stay inside the storage.
    pub(crate) fn from_parts(storage: Arc<Storage>, layout: Layout) -> Tensor {
        debug_assert!(
            layout.extent() <= storage.len(),
            "layout outside its storage"
        );
        Tensor(Arc::new(Inner {
            storage,
            layout,
            wrapped: false,
            autograd: Default::default(),
        }))
    }

    /// A new contiguous, zero-filled tensor.
    pub(crate) fn alloc(dtype: DType, shape: &[usize]) -> Result<Tensor> {
        Ok(Tensor::from_parts(
            Arc::new(Storage::zeros(dtype, checked_numel(shape)?)?),
            Layout::contiguous(shape),
        ))
    }

    /// A new contiguous tensor whose every element the caller overwrites (kernel outputs):
    /// the contents start unspecified, which lets it reuse a freed buffer.
    pub(crate) fn alloc_for_overwrite(dtype: DType, shape: &[usize]) -> Result<Tensor> {
        Ok(Tensor::from_parts(
            Arc::new(Storage::for_overwrite(dtype, checked_numel(shape)?)?),
            Layout::contiguous(shape),
        ))
    }

    /// A new contiguous tensor whose every element `fill` writes, in memory from the storage
    /// allocator (large buffers on huge pages) rather than a vector of the caller's.
    pub(crate) fn filled<T: Element>(
        shape: &[usize],
        fill: impl FnOnce(&mut [T]),
    ) -> Result<Tensor> {
        let t = Tensor::alloc_for_overwrite(T::DTYPE, shape)?;
        t.with_slice_mut(fill)?;
        Ok(t)
    }

    /// A view of the same storage with another layout.
    pub(crate) fn with_layout(&self, layout: Layout) -> Tensor {
        Tensor::from_parts(self.0.storage.clone(), layout)
    }

    /// Takes ownership of `data` without copying it (the `torch.from_numpy` of smelt).
    ///
    /// The tensor and every view of it share that memory: a write through one shows through
    /// all of them (`with_slice_mut`, in-place ops). The memory lives as long as any tensor
    /// that shares it; the compiler enforces this, since no borrowed buffer is ever kept.
    /// Get the elements back without copying with `into_vec` when this is the last owner.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        if data.len() != numel(shape) {
            bail!(
                Shape,
                "shape {shape:?} is invalid for input of size {}",
                data.len()
            );
        }
        Ok(Tensor::from_parts(
            Arc::new(Storage::from_vec(data)),
            Layout::contiguous(shape),
        ))
    }

    /// A tensor over host memory that another library owns (the import side of DLPack,
    /// NumPy arrays), without copying: `layout` places the elements in the memory at `ptr`,
    /// and `keep` is dropped, handing the memory back, when the last tensor over it goes.
    /// Writes through either side show through the other, as with `torch.from_dlpack`.
    ///
    /// # Errors
    /// A null or misaligned `ptr` for `dtype`, or a layout whose size overflows.
    ///
    /// # Safety
    /// Every element `layout` reaches (`layout.extent()` elements of `dtype` from `ptr`) must
    /// stay valid for reads and writes until `keep` is dropped.
    pub unsafe fn from_foreign(
        ptr: *mut u8,
        dtype: DType,
        layout: Layout,
        keep: Box<dyn std::any::Any + Send + Sync>,
    ) -> Result<Tensor> {
        if layout.strides.len() != layout.shape.len() {
            bail!(
                Value,
                "{} strides for a tensor of {} dims",
                layout.strides.len(),
                layout.shape.len()
            );
        }
        checked_numel(&layout.shape)?;
        let reach = layout
            .shape
            .iter()
            .zip(&layout.strides)
            .try_fold(layout.offset, |acc, (&n, &st)| {
                n.saturating_sub(1).checked_mul(st)?.checked_add(acc)
            });
        let nbytes = match reach {
            _ if layout.shape.contains(&0) => 0,
            Some(last) => storage::byte_len(dtype, last + 1)?,
            None => bail!(Value, "the layout {layout:?} overflows the address space"),
        };
        let ptr = match std::ptr::NonNull::new(ptr) {
            Some(p) => p,
            // exporters may give an empty tensor no memory at all
            None if nbytes == 0 => std::ptr::NonNull::<u64>::dangling().cast(),
            None => bail!(Value, "a null data pointer for a tensor of {nbytes} bytes"),
        };
        if !(ptr.as_ptr() as usize).is_multiple_of(dtype.size()) {
            bail!(
                Value,
                "the data pointer {:p} is not aligned for {dtype}",
                ptr.as_ptr()
            );
        }
        // SAFETY: the caller vouches for the `nbytes` bytes at `ptr` while `keep` lives.
        let storage = unsafe { Storage::from_foreign(ptr, nbytes, dtype, keep) };
        Ok(Tensor::from_parts(Arc::new(storage), layout))
    }

    /// Copies `data` into a new tensor of `shape`.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize]) -> Result<Tensor> {
        Tensor::from_vec(data.to_vec(), shape)
    }

    /// A 0-d tensor holding `value` (`torch.tensor(3.5)`: float → f32, int → i64).
    pub fn scalar(value: impl Into<Scalar>) -> Tensor {
        let s = value.into();
        let t = match s {
            Scalar::Bool(b) => Tensor::from_vec(vec![b], &[]),
            Scalar::Int(i) => Tensor::from_vec(vec![i], &[]),
            Scalar::Float(f) => Tensor::from_vec(vec![f as f32], &[]),
        };
        t.expect("one element fits a 0-d shape")
    }

    /// A Python-number operand: 0-d, f64/i64/bool, marked wrapped for type promotion.
    pub fn wrapped(value: Scalar) -> Tensor {
        let t = match value {
            Scalar::Bool(b) => Tensor::from_vec(vec![b], &[]),
            Scalar::Int(i) => Tensor::from_vec(vec![i], &[]),
            Scalar::Float(f) => Tensor::from_vec(vec![f], &[]),
        }
        .expect("one element fits a 0-d shape");
        Tensor(Arc::new(Inner {
            storage: t.0.storage.clone(),
            layout: t.0.layout.clone(),
            wrapped: true,
            autograd: Default::default(),
        }))
    }

    // ---- attributes -------------------------------------------------------------------

    /// The sizes (`x.shape`).
    pub fn shape(&self) -> &[usize] {
        &self.0.layout.shape
    }
    /// `size(dim)`, negative dims counting from the end.
    pub fn size(&self, dim: i64) -> Result<usize> {
        let d = crate::ir::shape::wrap_dim(dim, self.dim())?;
        Ok(if self.dim() == 0 { 1 } else { self.shape()[d] })
    }
    /// Number of dims.
    pub fn dim(&self) -> usize {
        self.0.layout.ndim()
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.0.layout.numel()
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.0.storage.dtype()
    }
    /// Where the data lives.
    pub fn device(&self) -> Device {
        self.0.storage.device()
    }
    /// Strides in elements (`x.stride()`).
    pub fn strides(&self) -> &[usize] {
        &self.0.layout.strides
    }
    /// Offset of the first element in the storage, in elements.
    pub fn storage_offset(&self) -> usize {
        self.0.layout.offset
    }
    /// Whether the elements are dense in row-major order.
    pub fn is_contiguous(&self) -> bool {
        self.0.layout.is_contiguous()
    }
    /// Bytes per element.
    pub fn element_size(&self) -> usize {
        self.dtype().size()
    }
    /// Whether this is a wrapped Python number (lowest priority in type promotion).
    pub fn is_wrapped_number(&self) -> bool {
        self.0.wrapped
    }
    /// True when both tensors view the same storage (writes through one may show in the other).
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0.storage, &other.0.storage)
    }
    /// Address of the first byte of the storage (for checking zero-copy claims).
    pub fn data_ptr(&self) -> usize {
        self.0.storage.data_addr() + self.storage_offset() * self.element_size()
    }
    /// The storage's version counter, bumped by every in-place write.
    pub fn version(&self) -> u64 {
        self.0.storage.version()
    }
    /// Shape, strides and offset.
    pub fn layout(&self) -> &Layout {
        &self.0.layout
    }
    pub(crate) fn storage(&self) -> &Storage {
        &self.0.storage
    }
    /// The shared storage itself (to build other views of it).
    pub(crate) fn storage_arc(&self) -> &Arc<Storage> {
        &self.0.storage
    }
    /// Dtype, shape and wrapped-ness: what op shape rules see.
    pub fn ttype(&self) -> TensorType {
        TensorType {
            dtype: self.dtype(),
            shape: self.shape().to_vec(),
            wrapped: self.0.wrapped,
        }
    }

    /// Gives back the storage as a `Vec` without copying, when this tensor is its only owner
    /// and covers it exactly; otherwise returns the tensor unchanged.
    pub fn into_vec<T: Element>(self) -> std::result::Result<Vec<T>, Tensor> {
        if T::DTYPE != self.dtype()
            || !self.is_contiguous()
            || self.storage_offset() != 0
            || self.numel() != self.storage().len()
        {
            return Err(self);
        }
        let inner = Arc::try_unwrap(self.0).map_err(Tensor)?;
        let Inner {
            storage, layout, ..
        } = inner;
        match Arc::try_unwrap(storage) {
            Ok(s) => Ok(s.into_vec::<T>()),
            Err(storage) => Err(Tensor::from_parts(storage, layout)),
        }
    }

    /// Runs `f` on the elements of a contiguous tensor, for reading.
    pub fn with_slice<T: Element, R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        self.check_plain::<T>()?;
        let acc = access::lock(&[self], &[]);
        // SAFETY: contiguous: numel elements from the first one, read lock held.
        Ok(f(unsafe {
            std::slice::from_raw_parts(acc.read::<T>(0), self.numel())
        }))
    }

    /// Runs `f` on the elements of a contiguous tensor, for writing: the change shows through
    /// every tensor that shares the storage. Bumps the version counter.
    pub fn with_slice_mut<T: Element, R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        self.check_plain::<T>()?;
        let acc = access::lock(&[], &[self]);
        self.storage().bump_version();
        // SAFETY: contiguous: numel elements from the first one, write lock held.
        Ok(f(unsafe {
            std::slice::from_raw_parts_mut(acc.write::<T>(0), self.numel())
        }))
    }

    fn check_plain<T: Element>(&self) -> Result<()> {
        if T::DTYPE != self.dtype() {
            bail!(
                DType,
                "tensor has dtype {} but {} was asked for",
                self.dtype(),
                T::DTYPE
            );
        }
        if !self.is_contiguous() {
            bail!(
                Value,
                "the tensor is not contiguous: call contiguous() first to get a slice of its elements"
            );
        }
        Ok(())
    }
}
