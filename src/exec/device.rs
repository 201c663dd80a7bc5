//! Moving tensors to GPUs. Defined here rather than with the transfers themselves
//! (`runtime::cuda::tensor`) because eager ops on a GPU tensor run through the CUDA executor:
//! moving a tensor to a GPU installs it in eager execution ([`crate::runtime::hooks::DEVICE`]).

use super::cuda_eager;
use crate::Result;
use crate::runtime::{Device, Tensor};

impl Tensor {
    /// The tensor on `device`: itself when it is already there (no copy, as in PyTorch).
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        if let Device::Cuda(_) = device {
            cuda_eager::register();
        }
        self.transfer(device)
    }

    /// As [`Tensor::to_device`], but a copy from pinned host memory to a GPU is queued on the
    /// current stream and not waited for (PyTorch's `to(device, non_blocking=True)`): the
    /// host thread goes on while the copy engine works. Writing the source before the copy
    /// has run (a later `synchronize`) may or may not change what arrives; its memory is
    /// kept alive by the result. Other moves are as `to_device`.
    pub fn to_device_non_blocking(&self, device: Device) -> Result<Tensor> {
        if let Device::Cuda(_) = device {
            cuda_eager::register();
        }
        self.transfer_non_blocking(device)
    }

    /// The tensor on the current GPU (`cuda::current_device`, `cuda:0` unless set).
    pub fn cuda(&self) -> Result<Tensor> {
        self.to_device(Device::Cuda(crate::runtime::cuda::current_device()?))
    }
}
