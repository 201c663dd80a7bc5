//! Moving tensors between the CPU and GPUs (`to`, `cpu()`, `cuda()`). Without a GPU, asking
//! for one is an error that says why, never a panic.

use crate::Result;
use crate::runtime::cuda::tensor::{download, upload};
use crate::runtime::device::Device;
use crate::runtime::tensor::Tensor;

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
    /// The tensor on the CPU (itself for a CPU tensor).
    pub fn cpu(&self) -> Result<Tensor> {
        self.to_device(Device::Cpu)
    }
    /// The tensor on `cuda:0`.
    pub fn cuda(&self) -> Result<Tensor> {
        self.to_device(Device::Cuda(0))
    }
}
