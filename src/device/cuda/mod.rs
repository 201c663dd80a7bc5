//! NVIDIA GPUs through the CUDA driver API (cudarc, loaded at run time): whether one is
//! there, what it is, and device memory through a caching allocator.
//!
//! Every function returns a clean error (or `false`) on a machine without a driver or a GPU:
//! the driver library is looked for before cudarc touches it, since cudarc's loader panics
//! when the library is missing, and driver calls run under `catch_unwind` as a second guard.

pub mod alloc;
pub mod blas;
pub mod copy;
pub mod driver;
pub mod locate;
pub mod memory;
pub mod nvrtc;
pub mod program;
pub mod stream;

pub use stream::{Event, Stream, current_stream, with_stream};

use crate::{Error, Result};
use cudarc::driver::{result, sys};

/// Runs a driver call, turning a panic inside cudarc (a missing symbol) into an error.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => Err(Error::Device(format!(
            "{what}: the CUDA driver library could not be used"
        ))),
    }
}

fn driver_err(what: &str, e: result::DriverError) -> Error {
    Error::Device(format!("{what}: {e:?}"))
}

/// Loads and initialises the driver once.
fn init() -> Result<()> {
    use std::sync::OnceLock;
    static INIT: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    INIT.get_or_init(|| {
        // SAFETY: only tries to open the library by its names.
        if !unsafe { sys::is_culib_present() } {
            return Err(
                "Found no NVIDIA driver on your system: the CUDA driver library (libcuda.so.1) is not installed".into(),
            );
        }
        guarded("cuInit", || {
            result::init().map_err(|e| driver_err("cuInit", e))
        })
        .map_err(|e| e.to_string())
    })
    .clone()
    .map_err(Error::Device)
}

/// True when a CUDA driver and at least one GPU are there (`torch.cuda.is_available()`).
pub fn is_available() -> bool {
    device_count().is_ok_and(|n| n > 0)
}

/// Number of GPUs (`torch.cuda.device_count()`); an error says why there is no driver.
pub fn device_count() -> Result<usize> {
    init()?;
    guarded("cuDeviceGetCount", || {
        result::device::get_count()
            .map(|n| n.max(0) as usize)
            .map_err(|e| driver_err("cuDeviceGetCount", e))
    })
}

fn device(i: usize) -> Result<sys::CUdevice> {
    let n = device_count()?;
    if i >= n {
        return Err(Error::Device(format!(
            "CUDA error: invalid device ordinal {i} (there {} {n} device{})",
            if n == 1 { "is" } else { "are" },
            if n == 1 { "" } else { "s" }
        )));
    }
    guarded("cuDeviceGet", || {
        result::device::get(i as i32).map_err(|e| driver_err("cuDeviceGet", e))
    })
}

/// The name of GPU `i` (`torch.cuda.get_device_name(i)`).
pub fn device_name(i: usize) -> Result<String> {
    let d = device(i)?;
    guarded("cuDeviceGetName", || {
        result::device::get_name(d).map_err(|e| driver_err("cuDeviceGetName", e))
    })
}

fn attribute(i: usize, a: sys::CUdevice_attribute) -> Result<i32> {
    let d = device(i)?;
    guarded("cuDeviceGetAttribute", || {
        // SAFETY: a valid device and attribute.
        unsafe { result::device::get_attribute(d, a) }
            .map_err(|e| driver_err("cuDeviceGetAttribute", e))
    })
}

/// The compute capability `(major, minor)` of GPU `i`.
pub fn compute_capability(i: usize) -> Result<(i32, i32)> {
    use sys::CUdevice_attribute::*;
    Ok((
        attribute(i, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        attribute(i, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    ))
}

/// Number of streaming multiprocessors of GPU `i`.
pub fn multiprocessor_count(i: usize) -> Result<usize> {
    Ok(attribute(
        i,
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    )? as usize)
}

/// Total memory of GPU `i` in bytes.
pub fn total_memory(i: usize) -> Result<usize> {
    let d = device(i)?;
    guarded("cuDeviceTotalMem", || {
        // SAFETY: a valid device.
        unsafe { result::device::total_mem(d) }.map_err(|e| driver_err("cuDeviceTotalMem", e))
    })
}

/// The driver's CUDA version `(major, minor)` (13.0 for 13000).
pub fn driver_version() -> Result<(i32, i32)> {
    init()?;
    guarded("cuDriverGetVersion", || {
        let mut v = 0;
        // SAFETY: a valid out-pointer.
        unsafe { sys::cuDriverGetVersion(&mut v) }
            .result()
            .map_err(|e| driver_err("cuDriverGetVersion", e))?;
        Ok((v / 1000, (v % 1000) / 10))
    })
}

thread_local! {
    static CURRENT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// `torch.cuda.current_device()`: the GPU that `cuda()` uses on this thread (0 until
/// [`set_device`]); an error without a GPU.
pub fn current_device() -> Result<usize> {
    if device_count()? == 0 {
        return Err(Error::Device(
            "CUDA error: no CUDA-capable device is detected".into(),
        ));
    }
    Ok(CURRENT.with(|c| c.get()))
}

/// `torch.cuda.set_device(i)`: makes GPU `i` this thread's current device.
pub fn set_device(i: usize) -> Result<()> {
    device(i)?;
    CURRENT.with(|c| c.set(i));
    Ok(())
}

/// `torch.cuda.synchronize()`: waits for all work queued on the current device.
pub fn synchronize() -> Result<()> {
    driver::Gpu::get(current_device()?)?.synchronize()
}

/// The `sm_XY` architecture of GPU `i`.
pub fn arch(i: usize) -> Result<String> {
    let (ma, mi) = compute_capability(i)?;
    Ok(format!("sm_{ma}{mi}"))
}
