//! Strided copies on the GPU: one small kernel per element size that walks a view of up to
//! 8 dims and writes another (the `contiguous()` and `copy_` of device tensors).

use super::driver::{Function, Gpu, Module};
use super::program;
use crate::layout::Layout;
use crate::{Result, bail};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

/// Most dims a strided copy walks.
pub const MAX_DIMS: usize = 8;

/// The CUDA C of the copy kernels (compiled once per device).
pub const SOURCE: &str = r#"
struct SmeltGeo {
    unsigned long long n, ndim, doff, soff;
    unsigned long long size[8], dst[8], src[8];
};
template <typename T>
__device__ void smelt_copy(T* __restrict__ d, const T* __restrict__ s, SmeltGeo g) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < g.n; i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned long long r = i, od = g.doff, os = g.soff;
        for (int k = (int)g.ndim - 1; k >= 0; --k) {
            unsigned long long p = r % g.size[k];
            r /= g.size[k];
            od += p * g.dst[k];
            os += p * g.src[k];
        }
        d[od] = s[os];
    }
}
extern "C" __global__ void smelt_copy_1(unsigned char* d, const unsigned char* s, SmeltGeo g) { smelt_copy(d, s, g); }
extern "C" __global__ void smelt_copy_2(unsigned short* d, const unsigned short* s, SmeltGeo g) { smelt_copy(d, s, g); }
extern "C" __global__ void smelt_copy_4(unsigned int* d, const unsigned int* s, SmeltGeo g) { smelt_copy(d, s, g); }
extern "C" __global__ void smelt_copy_8(unsigned long long* d, const unsigned long long* s, SmeltGeo g) { smelt_copy(d, s, g); }
"#;

/// The copy kernels of one device.
struct Kernels {
    _module: Arc<Module>,
    by_size: [Function; 4],
}

fn kernels(gpu: &Arc<Gpu>) -> Result<Arc<Kernels>> {
    static ALL: OnceLock<Mutex<HashMap<usize, Arc<Kernels>>>> = OnceLock::new();
    let all = ALL.get_or_init(|| Mutex::new(HashMap::new()));
    let mut all = all.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(k) = all.get(&gpu.ordinal()) {
        return Ok(k.clone());
    }
    let (module, _) = program::load(gpu, SOURCE, "smelt_copy.cu", false)?;
    let f = |n: usize| module.function(&format!("smelt_copy_{n}"));
    let k = Arc::new(Kernels {
        by_size: [f(1)?, f(2)?, f(4)?, f(8)?],
        _module: module,
    });
    all.insert(gpu.ordinal(), k.clone());
    Ok(k)
}

/// The geometry argument, laid out as the kernel's `SmeltGeo`.
#[repr(C)]
pub(crate) struct Geo {
    pub(crate) n: u64,
    pub(crate) ndim: u64,
    pub(crate) doff: u64,
    pub(crate) soff: u64,
    pub(crate) size: [u64; MAX_DIMS],
    pub(crate) dst: [u64; MAX_DIMS],
    pub(crate) src: [u64; MAX_DIMS],
}

/// The kernel's geometry for copying view `src` to view `dst` (same shape): dims of size
/// 1 dropped, so only views of more than 8 real dims are refused.
pub(crate) fn geometry(dst: &Layout, src: &Layout) -> Result<Geo> {
    if dst.shape != src.shape {
        bail!(
            Shape,
            "copy: shapes {:?} and {:?} differ",
            dst.shape,
            src.shape
        );
    }
    let dims: Vec<usize> = (0..dst.shape.len())
        .filter(|&d| dst.shape[d] != 1)
        .collect();
    if dims.len() > MAX_DIMS {
        bail!(
            Unsupported,
            "a strided copy on the GPU walks at most {MAX_DIMS} dims of size > 1 (got {})",
            dims.len()
        );
    }
    let mut g = Geo {
        n: dst.shape.iter().product::<usize>() as u64,
        ndim: dims.len() as u64,
        doff: dst.offset as u64,
        soff: src.offset as u64,
        size: [1; MAX_DIMS],
        dst: [0; MAX_DIMS],
        src: [0; MAX_DIMS],
    };
    for (k, &d) in dims.iter().enumerate() {
        g.size[k] = dst.shape[d] as u64;
        g.dst[k] = dst.strides[d] as u64;
        g.src[k] = src.strides[d] as u64;
    }
    Ok(g)
}

/// Copies the elements of view `src` (of the buffer at `src_ptr`) to view `dst` (of the
/// buffer at `dst_ptr`), both of `elem` bytes per element and of the same shape.
pub fn strided(
    gpu: &Arc<Gpu>,
    elem: usize,
    dst_ptr: u64,
    dst: &Layout,
    src_ptr: u64,
    src: &Layout,
) -> Result<()> {
    let mut g = geometry(dst, src)?;
    let n = g.n as usize;
    if n == 0 {
        return Ok(());
    }
    let slot = match elem {
        1 => 0,
        2 => 1,
        4 => 2,
        8 => 3,
        _ => bail!(Unsupported, "copy: no kernel for {elem}-byte elements"),
    };
    let k = kernels(gpu)?;
    let block = 256u32;
    let grid = n.div_ceil(block as usize).clamp(1, 1 << 16) as u32;
    let (mut d, mut s) = (dst_ptr, src_ptr);
    let mut params: [*mut c_void; 3] = [
        &mut d as *mut u64 as *mut c_void,
        &mut s as *mut u64 as *mut c_void,
        &mut g as *mut Geo as *mut c_void,
    ];
    // SAFETY: both views lie inside their buffers (the callers' layouts are checked against
    // their storages), and the parameters match the kernel's signature.
    unsafe { k.by_size[slot].launch_raw(grid, block, 0, &mut params) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_refuses_mismatched_shapes_and_too_many_dims() {
        let e = geometry(&Layout::contiguous(&[2, 3]), &Layout::contiguous(&[3, 2]));
        assert!(e.is_err());
        let nine = Layout::contiguous(&[2; 9]);
        assert!(geometry(&nine, &nine).is_err());
    }
}
