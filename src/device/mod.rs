//! Where a tensor lives: the `Device` enum, the GPU runtime that needs no tensor (the CUDA
//! driver, device memory, streams, NVRTC, cuBLAS, strided copies) and the disk cache's home.

pub mod cache;
pub mod cuda;

use std::fmt;
use std::str::FromStr;

/// Where a tensor's memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Device {
    #[default]
    /// Host memory.
    Cpu,
    /// The memory of the CUDA device with this ordinal.
    Cuda(usize),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl FromStr for Device {
    type Err = crate::Error;
    fn from_str(s: &str) -> crate::Result<Device> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| {
                    crate::Error::Device(format!(
                        "Expected one of cpu, cuda device type at start of device string: {s}"
                    ))
                }),
        }
    }
}
