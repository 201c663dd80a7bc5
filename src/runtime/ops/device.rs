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
    /// The copy behind [`Tensor::to_device`] (defined with the CUDA executor, which must be
    /// loaded before ops run on a GPU tensor); itself when it is already on `device`.
    pub(crate) fn transfer(&self, device: Device) -> Result<Tensor> {
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
    /// The copy behind [`Tensor::to_device_non_blocking`].
    pub(crate) fn transfer_non_blocking(&self, device: Device) -> Result<Tensor> {
        match (self.device(), device) {
            (Device::Cpu, Device::Cuda(i)) => upload_non_blocking(self, i),
            _ => self.transfer(device),
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
        self.transfer(Device::Cpu)
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
