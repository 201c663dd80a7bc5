//! NVIDIA GPUs, as `runtime::cuda`: everything of [`crate::device::cuda`] (the driver,
//! device memory, streams, NVRTC, cuBLAS, strided copies), and here, above the tensor, what
//! takes tensors: moving them between host and device (`tensor`) and cuDNN's convolutions
//! (`dnn`).

pub mod dnn;
pub mod tensor;
#[cfg(test)]
mod tests;

pub use crate::device::cuda::*;

/// A readable report of the CUDA environment: driver, devices, NVRTC and the headers. Every
/// line says what is there or why not; it never fails.
pub fn environment_report() -> String {
    let mut out = String::new();
    match driver_version() {
        Ok((ma, mi)) => out.push_str(&format!("driver: CUDA {ma}.{mi}\n")),
        Err(e) => out.push_str(&format!("driver: none ({e})\n")),
    }
    match device_count() {
        Ok(n) => {
            out.push_str(&format!("devices: {n}\n"));
            if let Ok(c) = current_device() {
                out.push_str(&format!("current device: cuda:{c}\n"));
            }
            for i in 0..n {
                let name = device_name(i).unwrap_or_else(|e| format!("? ({e})"));
                let arch = arch(i).unwrap_or_else(|e| format!("? ({e})"));
                let mem = total_memory(i)
                    .map(|b| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64))
                    .unwrap_or_else(|e| format!("? ({e})"));
                out.push_str(&format!("  cuda:{i}: {name}, {arch}, {mem}\n"));
            }
        }
        Err(_) => out.push_str("devices: 0\n"),
    }
    match nvrtc::version() {
        Ok((ma, mi)) => {
            let path = nvrtc::library_path()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            out.push_str(&format!("nvrtc: {ma}.{mi} ({path})\n"));
        }
        Err(e) => out.push_str(&format!("nvrtc: none ({e})\n")),
    }
    match locate::cuda_include() {
        Ok(p) => out.push_str(&format!("headers: {}\n", p.display())),
        Err(_) => {
            out.push_str("headers: none (cuda_fp16.h not found; f16/bf16 kernels cannot compile)\n")
        }
    }
    match dnn::version() {
        Ok(v) => out.push_str(&format!("cudnn: {v}\n")),
        Err(e) => out.push_str(&format!(
            "cudnn: none, convolutions run generated kernels ({e})\n"
        )),
    }
    out
}
