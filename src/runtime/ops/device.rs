//! Moving tensors between the CPU and GPUs (`to`, `cpu()`, `cuda()`) and page-locked host
//! memory for faster transfers (`pin_memory()`). Without a GPU, asking for one is an error
//! that says why, never a panic.

use crate::runtime::access;
use crate::runtime::cuda::tensor::{download, record_stream, upload, upload_non_blocking};
use crate::runtime::device::Device;
use crate::runtime::layout::Layout;
use crate::runtime::storage::Storage;
use crate::runtime::tensor::Tensor;
use crate::{Result, bail};
use std::sync::Arc;

impl Tensor {
    /// The tensor on `device`: itself when it is already there (no copy, as in PyTorch).
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        match (self.device(), device) {
            (Device::Cpu, Device::Cuda(i)) => upload(self, i),
            (Device::Cuda(_), Device::Cpu) => download(self),
            (Device::Cuda(_), Device::Cuda(i)) => upload(&download(self)?, i),
            (Device::Cpu, Device::Cpu) => Ok(self.clone()),
        }
    }
    /// As [`Tensor::to_device`], but a copy from pinned host memory to a GPU is queued on the
    /// current stream and not waited for (PyTorch's `to(device, non_blocking=True)`): the
    /// host thread goes on while the copy engine works. Writing the source before the copy
    /// has run (a later `synchronize`) may or may not change what arrives; its memory is
    /// kept alive by the result. Other moves are as `to_device`.
    pub fn to_device_non_blocking(&self, device: Device) -> Result<Tensor> {
        match (self.device(), device) {
            (Device::Cpu, Device::Cuda(i)) => upload_non_blocking(self, i),
            _ => self.to_device(device),
        }
    }

    /// Tells the caching allocator that work queued on `stream` uses this GPU tensor
    /// (PyTorch's `record_stream`): when the tensor is freed, its memory waits for that
    /// work before it is reused. Needed when a tensor made on one stream is used on another.
    pub fn record_stream(&self, stream: &crate::runtime::cuda::Stream) -> Result<()> {
        record_stream(self, stream)
    }

    /// The tensor on the CPU (itself for a CPU tensor).
    pub fn cpu(&self) -> Result<Tensor> {
        self.to_device(Device::Cpu)
    }
    /// The tensor on the current GPU (`cuda::current_device`, `cuda:0` unless set).
    pub fn cuda(&self) -> Result<Tensor> {
        self.to_device(Device::Cuda(crate::runtime::cuda::current_device()?))
    }

    /// A dense copy in page-locked host memory (itself when it is pinned already), as
    /// PyTorch's `pin_memory()`: copies from it to a GPU need no staging. An error for a GPU
    /// tensor, or where there is no GPU driver.
    pub fn pin_memory(&self) -> Result<Tensor> {
        if self.device() != Device::Cpu {
            bail!(
                Device,
                "cannot pin '{}' memory: only dense CPU tensors can be pinned",
                self.device()
            );
        }
        if self.is_pinned() {
            return Ok(self.clone());
        }
        let src = crate::runtime::kernels::copy::contiguous(self)?;
        let st = Arc::new(Storage::pinned(self.dtype(), self.numel())?);
        let out = Tensor::from_parts(st, Layout::contiguous(self.shape()));
        let nbytes = self.numel() * self.element_size();
        if nbytes > 0 {
            let acc = access::lock(&[&src], &[&out]);
            // SAFETY: both are contiguous with `nbytes` bytes from their first element, in
            // different storages.
            unsafe { std::ptr::copy_nonoverlapping(acc.read::<u8>(0), acc.write::<u8>(0), nbytes) };
        }
        Ok(out)
    }

    /// Whether the tensor's memory is page-locked (`pin_memory`).
    pub fn is_pinned(&self) -> bool {
        self.storage().is_pinned()
    }
}
