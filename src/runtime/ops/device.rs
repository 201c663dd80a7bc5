//! Moving tensors between devices. This build has only the CPU backend, so asking for a
//! CUDA device is an error, never a panic.

use crate::runtime::device::Device;
use crate::runtime::tensor::Tensor;
use crate::{Result, bail};

impl Tensor {
    /// The tensor on `device`: itself when it is already there (no copy, as in PyTorch).
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        match device {
            Device::Cpu => bail!(
                Device,
                "cannot copy a tensor from {} to cpu: this build of smelt has no {} backend",
                self.device(),
                self.device()
            ),
            Device::Cuda(_) => bail!(
                Device,
                "CUDA is not available: this build of smelt has no CUDA backend (asked for {device})"
            ),
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
