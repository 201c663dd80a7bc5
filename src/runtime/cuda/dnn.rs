//! Convolutions on the GPU through cuDNN (loaded at run time, like the driver): the forward
//! convolution with its bias, and both gradients, on NCHW or NHWC views.
//!
//! cuDNN 9 is a main library that opens its sublibraries (`libcudnn_ops.so.9`, ...) by
//! name, and refuses to work when they come from another release. So the library is opened
//! by its full path ([`super::locate::cudnn_library`]), its sublibraries from the same folder
//! first, and called through a table of its functions read from that one library, never
//! through whatever `libcudnn.so` the loader's path finds first.
//!
//! A call cuDNN cannot take (no library, an asymmetric `"same"` padding, an empty operand,
//! a shape its descriptors refuse) answers `Ok(false)` and the caller runs the generated
//! kernel instead, so a missing or unusable cuDNN never fails a convolution; operands
//! neither NCHW nor NHWC are copied dense first. f32 and f64 use plain FMA
//! arithmetic (no TF32: the results match the CPU's within float rounding, as PyTorch's with
//! `allow_tf32 = False`); f16 and bf16 multiply on tensor cores and accumulate in f32.

use super::driver::Gpu;
use super::memory::DeviceBuffer;
use crate::ir::conv::ConvGeometry;
use crate::ir::dtype::DType;
use crate::ir::op::Op;
use crate::runtime::Tensor;
use crate::{Error, Result};
use cudarc::cudnn::{result, sys};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

static CALLS: AtomicUsize = AtomicUsize::new(0);

/// How many convolutions cuDNN has run in this process (what tests and profiles read to
/// tell cuDNN from the generated kernels).
pub fn calls() -> usize {
    CALLS.load(Ordering::Relaxed)
}

struct Handle(sys::cudnnHandle_t);
// SAFETY: a cuDNN handle is used under the table's lock only.
unsafe impl Send for Handle {}

fn dnn_err(what: &str, e: result::CudnnError) -> Error {
    Error::Device(format!("cuDNN error in {what}: {e:?}"))
}

type Status = sys::cudnnStatus_t;
type TensorD = sys::cudnnTensorDescriptor_t;
type FilterD = sys::cudnnFilterDescriptor_t;
type ConvD = sys::cudnnConvolutionDescriptor_t;
type Ptr = *const c_void;
type MutPtr = *mut c_void;

/// Declares the table of cuDNN functions smelt calls, each read by name from one library.
macro_rules! api {
    ($($name:ident($($arg:ty),*);)*) => {
        #[allow(non_snake_case)]
        struct Api {
            $($name: unsafe extern "C" fn($($arg),*) -> Status,)*
            cudnnGetVersion: unsafe extern "C" fn() -> usize,
        }

        impl Api {
            /// # Safety
            /// `lib` must be cuDNN: each symbol is taken to have cuDNN's signature.
            unsafe fn read(lib: &libloading::Library) -> std::result::Result<Api, String> {
                // SAFETY: as the caller promises.
                unsafe {
                    Ok(Api {
                        $($name: *lib
                            .get(concat!(stringify!($name), "\0").as_bytes())
                            .map_err(|e| format!("{}: {e}", stringify!($name)))?,)*
                        cudnnGetVersion: *lib
                            .get(b"cudnnGetVersion\0")
                            .map_err(|e| format!("cudnnGetVersion: {e}"))?,
                    })
                }
            }
        }
    };
}

api! {
    cudnnCreate(*mut sys::cudnnHandle_t);
    cudnnSetStream(sys::cudnnHandle_t, sys::cudaStream_t);
    cudnnCreateTensorDescriptor(*mut TensorD);
    cudnnSetTensor4dDescriptorEx(TensorD, sys::cudnnDataType_t, i32, i32, i32, i32, i32, i32, i32, i32);
    cudnnDestroyTensorDescriptor(TensorD);
    cudnnCreateFilterDescriptor(*mut FilterD);
    cudnnSetFilter4dDescriptor(FilterD, sys::cudnnDataType_t, sys::cudnnTensorFormat_t, i32, i32, i32, i32);
    cudnnDestroyFilterDescriptor(FilterD);
    cudnnCreateConvolutionDescriptor(*mut ConvD);
    cudnnSetConvolution2dDescriptor(ConvD, i32, i32, i32, i32, i32, i32, sys::cudnnConvolutionMode_t, sys::cudnnDataType_t);
    cudnnSetConvolutionGroupCount(ConvD, i32);
    cudnnSetConvolutionMathType(ConvD, sys::cudnnMathType_t);
    cudnnDestroyConvolutionDescriptor(ConvD);
    cudnnGetConvolutionForwardAlgorithm_v7(sys::cudnnHandle_t, TensorD, FilterD, ConvD, TensorD, i32, *mut i32, *mut sys::cudnnConvolutionFwdAlgoPerf_t);
    cudnnGetConvolutionForwardWorkspaceSize(sys::cudnnHandle_t, TensorD, FilterD, ConvD, TensorD, sys::cudnnConvolutionFwdAlgo_t, *mut usize);
    cudnnConvolutionForward(sys::cudnnHandle_t, Ptr, TensorD, Ptr, FilterD, Ptr, ConvD, sys::cudnnConvolutionFwdAlgo_t, MutPtr, usize, Ptr, TensorD, MutPtr);
    cudnnAddTensor(sys::cudnnHandle_t, Ptr, TensorD, Ptr, Ptr, TensorD, MutPtr);
    cudnnGetConvolutionBackwardDataAlgorithm_v7(sys::cudnnHandle_t, FilterD, TensorD, ConvD, TensorD, i32, *mut i32, *mut sys::cudnnConvolutionBwdDataAlgoPerf_t);
    cudnnGetConvolutionBackwardDataWorkspaceSize(sys::cudnnHandle_t, FilterD, TensorD, ConvD, TensorD, sys::cudnnConvolutionBwdDataAlgo_t, *mut usize);
    cudnnConvolutionBackwardData(sys::cudnnHandle_t, Ptr, FilterD, Ptr, TensorD, Ptr, ConvD, sys::cudnnConvolutionBwdDataAlgo_t, MutPtr, usize, Ptr, TensorD, MutPtr);
    cudnnGetConvolutionBackwardFilterAlgorithm_v7(sys::cudnnHandle_t, TensorD, TensorD, ConvD, FilterD, i32, *mut i32, *mut sys::cudnnConvolutionBwdFilterAlgoPerf_t);
    cudnnGetConvolutionBackwardFilterWorkspaceSize(sys::cudnnHandle_t, TensorD, TensorD, ConvD, FilterD, sys::cudnnConvolutionBwdFilterAlgo_t, *mut usize);
    cudnnConvolutionBackwardFilter(sys::cudnnHandle_t, Ptr, TensorD, Ptr, TensorD, Ptr, ConvD, sys::cudnnConvolutionBwdFilterAlgo_t, MutPtr, usize, Ptr, FilterD, MutPtr);
}

/// cuDNN's sublibraries, each opened from the main library's folder before it (a
/// sublibrary's own dependencies on the others come earlier in the list).
const SUBLIBRARIES: [&str; 7] = [
    "libcudnn_graph.so.9",
    "libcudnn_engines_precompiled.so.9",
    "libcudnn_engines_runtime_compiled.so.9",
    "libcudnn_heuristic.so.9",
    "libcudnn_ops.so.9",
    "libcudnn_cnn.so.9",
    "libcudnn_adv.so.9",
];

/// Opens `path` for good, its symbols visible to the libraries opened after it.
fn open_global(path: &std::path::Path) -> std::result::Result<libloading::Library, String> {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    // SAFETY: cuDNN's libraries run no code at load time that depends on us.
    unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }
        .map(libloading::Library::from)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The function table, or why cuDNN cannot be used here; opened and tried once per process
/// (a descriptor created and set, which fails when the sublibraries do not match).
fn api() -> std::result::Result<&'static Api, String> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| {
        let path = super::locate::cudnn_library().map_err(|tried| {
            format!(
                "the cuDNN library (libcudnn.so.9) was not found (set SMELT_CUDNN_LIB, or install NVIDIA's nvidia-cudnn wheel); looked in {}",
                tried.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            )
        })?;
        let dir = path.parent().unwrap_or(std::path::Path::new("."));
        for sub in SUBLIBRARIES {
            let p = dir.join(sub);
            if p.is_file() {
                // kept open for the life of the process
                std::mem::forget(open_global(&p)?);
            }
        }
        let lib = open_global(&path)?;
        // SAFETY: the library is cuDNN (found by its name).
        let api = unsafe { Api::read(&lib) }?;
        std::mem::forget(lib);
        probe(&api).map_err(|e| format!("cuDNN at {} cannot be used: {e}", path.display()))?;
        Ok(api)
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// A tensor descriptor created, set and destroyed.
fn probe(api: &Api) -> std::result::Result<(), String> {
    let mut d = std::ptr::null_mut();
    // SAFETY: functions of the table, a descriptor created and destroyed once.
    unsafe {
        (api.cudnnCreateTensorDescriptor)(&mut d)
            .result()
            .map_err(|e| format!("{e:?}"))?;
        let r = (api.cudnnSetTensor4dDescriptorEx)(
            d,
            sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
            1,
            1,
            1,
            1,
            1,
            1,
            1,
            1,
        )
        .result();
        (api.cudnnDestroyTensorDescriptor)(d)
            .result()
            .map_err(|e| format!("{e:?}"))?;
        r.map_err(|e| format!("{e:?}"))
    }
}

/// Whether cuDNN can be used here (`torch.backends.cudnn.is_available()`).
pub fn is_available() -> bool {
    api().is_ok()
}

/// cuDNN's version (`torch.backends.cudnn.version()`), e.g. 91900 for 9.19.0, or why it
/// cannot be used.
pub fn version() -> Result<usize> {
    let api = api().map_err(Error::Device)?;
    // SAFETY: takes no arguments.
    Ok(unsafe { (api.cudnnGetVersion)() })
}

/// `SMELT_CUDNN=0` turns cuDNN off (the generated kernels run instead), for comparisons.
fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("SMELT_CUDNN").as_deref() != Ok("0") && is_available())
}

fn with_handle<T>(gpu: &Gpu, f: impl FnOnce(&Api, sys::cudnnHandle_t) -> Result<T>) -> Result<T> {
    static ALL: OnceLock<Mutex<HashMap<usize, Handle>>> = OnceLock::new();
    let api = api().map_err(Error::Device)?;
    let all = ALL.get_or_init(|| Mutex::new(HashMap::new()));
    let mut all = all.lock().unwrap_or_else(|e| e.into_inner());
    gpu.bind()?;
    let h = match all.entry(gpu.ordinal()) {
        std::collections::hash_map::Entry::Occupied(e) => e.get().0,
        std::collections::hash_map::Entry::Vacant(e) => {
            let mut h = std::ptr::null_mut();
            // SAFETY: the device's context is current.
            unsafe { (api.cudnnCreate)(&mut h) }
                .result()
                .map_err(|e| dnn_err("cudnnCreate", e))?;
            e.insert(Handle(h)).0
        }
    };
    let stream = super::stream::raw_for(gpu.ordinal());
    // SAFETY: a live handle; the thread's current stream of this device is live.
    unsafe { (api.cudnnSetStream)(h, stream as sys::cudaStream_t) }
        .result()
        .map_err(|e| dnn_err("cudnnSetStream", e))?;
    f(api, h)
}

/// How a 4-D operand lies in memory, for cuDNN's descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Nchw,
    Nhwc,
}

/// A 4-D view `[n, c, h, w]` of an operand: its device address and packed layout.
#[derive(Clone, Debug)]
struct View4 {
    ptr: u64,
    dims: [usize; 4],
    format: Format,
}

impl View4 {
    fn strides(&self) -> [usize; 4] {
        let [_, c, h, w] = self.dims;
        match self.format {
            Format::Nchw => [c * h * w, h * w, w, 1],
            Format::Nhwc => [h * w * c, 1, w * c, c],
        }
    }
}

/// The packed format `strides` follow for `dims` (a dim of size 1 takes any stride).
fn format_of(dims: &[usize; 4], strides: &[usize; 4]) -> Option<Format> {
    [Format::Nchw, Format::Nhwc].into_iter().find(|&f| {
        let v = View4 {
            ptr: 0,
            dims: *dims,
            format: f,
        };
        let want = v.strides();
        (0..4).all(|i| dims[i] <= 1 || strides[i] == want[i])
    })
}

/// `shape`/`strides` of an operand with `spatial` spatial dims (batched or not) as 4-D
/// sizes and strides: a missing batch dim and a 1-d convolution's height are size 1.
fn as_4d(shape: &[usize], strides: &[usize], spatial: usize) -> Option<([usize; 4], [usize; 4])> {
    let (mut d, mut s): (Vec<usize>, Vec<usize>) = (shape.to_vec(), strides.to_vec());
    if d.len() == spatial + 1 {
        d.insert(0, 1);
        s.insert(0, 0);
    }
    if d.len() != spatial + 2 {
        return None;
    }
    if spatial == 1 {
        d.insert(2, 1);
        s.insert(2, 0);
    }
    Some((d.try_into().ok()?, s.try_into().ok()?))
}

/// Whether `x` fits the C `int` cuDNN's descriptors take.
fn fits_int(x: usize) -> bool {
    i32::try_from(x).is_ok()
}

/// `t` as a 4-D packed view, copied dense on the device when its layout is neither NCHW nor
/// NHWC; `keep` holds the copy alive.
fn view4(t: &Tensor, spatial: usize, keep: &mut Vec<Tensor>) -> Result<Option<View4>> {
    let Some((dims, strides)) = as_4d(t.shape(), t.strides(), spatial) else {
        return Ok(None);
    };
    // every stride of a packed view is below its element count
    if !fits_int(dims.iter().product()) {
        return Ok(None);
    }
    let (t, format) = match format_of(&dims, &strides) {
        Some(f) => (t.clone(), f),
        None => (super::tensor::contiguous_copy(t)?, Format::Nchw),
    };
    let base = t.storage().device_ptr().unwrap_or(0);
    let ptr = base + (t.storage_offset() * t.dtype().size()) as u64;
    keep.push(t);
    Ok(Some(View4 { ptr, dims, format }))
}

/// The output buffer of a call: its address and 4-D layout.
pub struct Out<'a> {
    /// Device address of the first element.
    pub ptr: u64,
    /// The result's shape.
    pub shape: &'a [usize],
    /// Its strides (contiguous or channels_last).
    pub strides: &'a [usize],
}

fn data_type(d: DType) -> Option<sys::cudnnDataType_t> {
    use sys::cudnnDataType_t::*;
    Some(match d {
        DType::F32 => CUDNN_DATA_FLOAT,
        DType::F64 => CUDNN_DATA_DOUBLE,
        DType::F16 => CUDNN_DATA_HALF,
        DType::BF16 => CUDNN_DATA_BFLOAT16,
        _ => return None,
    })
}

/// Descriptors of one convolution (`x` its input, `y` its output, `w` its weight),
/// destroyed on drop.
struct Descs {
    api: &'static Api,
    x: TensorD,
    y: TensorD,
    w: FilterD,
    conv: ConvD,
    /// f32/f64: no tensor-core (TF32) algorithms.
    exact: bool,
    /// alpha and beta are doubles (f64 data), else floats.
    double: bool,
}

impl Drop for Descs {
    fn drop(&mut self) {
        let a = self.api;
        // SAFETY: each created once in `Descs::new` (null when its creation failed, which
        // cuDNN's destroy functions accept) and destroyed once here.
        unsafe {
            (a.cudnnDestroyTensorDescriptor)(self.x);
            (a.cudnnDestroyTensorDescriptor)(self.y);
            (a.cudnnDestroyFilterDescriptor)(self.w);
            (a.cudnnDestroyConvolutionDescriptor)(self.conv);
        }
    }
}

fn check(what: &str, s: Status) -> Result<()> {
    s.result().map_err(|e| dnn_err(what, e))
}

/// A 4-D tensor descriptor of `v`; the caller destroys it.
fn tensor_desc(api: &Api, dt: sys::cudnnDataType_t, v: &View4) -> Result<TensorD> {
    let mut d = std::ptr::null_mut();
    // SAFETY: a fresh descriptor, set once.
    unsafe {
        check(
            "cudnnCreateTensorDescriptor",
            (api.cudnnCreateTensorDescriptor)(&mut d),
        )?;
        let [n, c, h, w] = v.dims.map(|x| x as i32);
        let [sn, sc, sh, sw] = v.strides().map(|x| x.max(1) as i32);
        let r = (api.cudnnSetTensor4dDescriptorEx)(d, dt, n, c, h, w, sn, sc, sh, sw);
        if let Err(e) = check("cudnnSetTensor4dDescriptorEx", r) {
            (api.cudnnDestroyTensorDescriptor)(d);
            return Err(e);
        }
    }
    Ok(d)
}

/// A spatial attribute of a 1-d or 2-d convolution as (height, width): a 1-d convolution
/// is a 2-d one of height 1.
fn hw(v: &[usize], spatial: usize, one: usize) -> (i32, i32) {
    if spatial == 1 {
        (one as i32, v[0] as i32)
    } else {
        (v[0] as i32, v[1] as i32)
    }
}

impl Descs {
    fn new(
        api: &'static Api,
        dtype: DType,
        x: &View4,
        y: &View4,
        w: &View4,
        g: &ConvGeometry,
        spatial: usize,
    ) -> Result<Descs> {
        let dt = data_type(dtype).ok_or_else(|| Error::DType(format!("cuDNN: {dtype}")))?;
        let double = dtype == DType::F64;
        let mut d = Descs {
            api,
            x: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
            exact: matches!(dtype, DType::F32 | DType::F64),
            double,
        };
        d.x = tensor_desc(api, dt, x)?;
        d.y = tensor_desc(api, dt, y)?;
        let compute = if double {
            sys::cudnnDataType_t::CUDNN_DATA_DOUBLE
        } else {
            sys::cudnnDataType_t::CUDNN_DATA_FLOAT
        };
        let fmt = match w.format {
            Format::Nchw => sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
            Format::Nhwc => sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC,
        };
        let (ph, pw) = hw(&g.pad_lo, spatial, 0);
        let (sh, sw) = hw(&g.stride, spatial, 1);
        let (dh, dw) = hw(&g.dilation, spatial, 1);
        let [k, c, kh, kw] = w.dims.map(|x| x as i32);
        let math = if d.exact {
            sys::cudnnMathType_t::CUDNN_FMA_MATH
        } else {
            sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH
        };
        // SAFETY: fresh descriptors, each set once; `d` destroys them on an early return.
        unsafe {
            check(
                "cudnnCreateFilterDescriptor",
                (api.cudnnCreateFilterDescriptor)(&mut d.w),
            )?;
            check(
                "cudnnSetFilter4dDescriptor",
                (api.cudnnSetFilter4dDescriptor)(d.w, dt, fmt, k, c, kh, kw),
            )?;
            check(
                "cudnnCreateConvolutionDescriptor",
                (api.cudnnCreateConvolutionDescriptor)(&mut d.conv),
            )?;
            check(
                "cudnnSetConvolution2dDescriptor",
                (api.cudnnSetConvolution2dDescriptor)(
                    d.conv,
                    ph,
                    pw,
                    sh,
                    sw,
                    dh,
                    dw,
                    sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                    compute,
                ),
            )?;
            check(
                "cudnnSetConvolutionGroupCount",
                (api.cudnnSetConvolutionGroupCount)(d.conv, g.groups as i32),
            )?;
            check(
                "cudnnSetConvolutionMathType",
                (api.cudnnSetConvolutionMathType)(d.conv, math),
            )?;
        }
        Ok(d)
    }

    /// Whether an algorithm of math type `m` keeps f32/f64 exact (no TF32).
    fn allows(&self, m: sys::cudnnMathType_t) -> bool {
        use sys::cudnnMathType_t::*;
        !self.exact || matches!(m, CUDNN_FMA_MATH | CUDNN_DEFAULT_MATH)
    }

    /// alpha = 1 and beta = 0 in the scaling type cuDNN reads for this dtype.
    fn scalars(&self) -> ([u8; 8], [u8; 8]) {
        if self.double {
            (1f64.to_ne_bytes(), 0f64.to_ne_bytes())
        } else {
            let mut a = [0u8; 8];
            a[..4].copy_from_slice(&1f32.to_ne_bytes());
            (a, [0u8; 8])
        }
    }

    /// The algorithm for this convolution and its workspace in bytes: the first of cuDNN's
    /// ranked ones (`rank`) that ran its heuristics successfully, keeps f32/f64 exact and
    /// needs at most [`MAX_WORKSPACE`]. Chosen once per `key` (the shapes, layouts, dtype and
    /// geometry) and remembered, since cuDNN's heuristics cost more than many convolutions;
    /// the descriptor takes its math type. `None`: no algorithm fits.
    fn choose<P: AlgoPerf>(
        &self,
        key: &str,
        rank: impl FnOnce() -> Result<Vec<P>>,
        size: impl FnOnce(P::Algo) -> Result<usize>,
    ) -> Result<Option<(P::Algo, usize)>> {
        let cached = P::chosen()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .copied();
        let choice = match cached {
            Some(c) => c,
            None => {
                let perf = rank()?;
                let c = match perf.iter().find(|p| {
                    p.status() == Status::CUDNN_STATUS_SUCCESS
                        && p.memory() <= MAX_WORKSPACE
                        && self.allows(p.math())
                }) {
                    Some(p) => {
                        self.set_math(p.math())?;
                        Some((p.algo(), p.math(), size(p.algo())?))
                    }
                    None => None,
                };
                P::chosen()
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key.to_string(), c);
                c
            }
        };
        let Some((algo, math, bytes)) = choice else {
            return Ok(None);
        };
        self.set_math(math)?;
        Ok(Some((algo, bytes)))
    }

    fn set_math(&self, m: sys::cudnnMathType_t) -> Result<()> {
        // SAFETY: a live descriptor.
        check("cudnnSetConvolutionMathType", unsafe {
            (self.api.cudnnSetConvolutionMathType)(self.conv, m)
        })
    }
}

/// An algorithm, its math type and its workspace in bytes, per convolution key.
type Chosen<A> = Mutex<HashMap<String, Option<(A, sys::cudnnMathType_t, usize)>>>;

/// What the three algorithm-ranking results share.
trait AlgoPerf: Copy + 'static {
    type Algo: Copy + Send + 'static;
    /// The choices made so far for this direction.
    fn chosen() -> &'static Chosen<Self::Algo>;
    fn algo(&self) -> Self::Algo;
    fn status(&self) -> Status;
    fn memory(&self) -> usize;
    fn math(&self) -> sys::cudnnMathType_t;
}

macro_rules! algo_perf {
    ($($perf:ty => $algo:ty),*) => {$(
        impl AlgoPerf for $perf {
            type Algo = $algo;
            fn chosen() -> &'static Chosen<$algo> {
                static C: OnceLock<Chosen<$algo>> = OnceLock::new();
                C.get_or_init(|| Mutex::new(HashMap::new()))
            }
            fn algo(&self) -> $algo { self.algo }
            fn status(&self) -> Status { self.status }
            fn memory(&self) -> usize { self.memory }
            fn math(&self) -> sys::cudnnMathType_t { self.mathType }
        }
    )*};
}

algo_perf!(
    sys::cudnnConvolutionFwdAlgoPerf_t => sys::cudnnConvolutionFwdAlgo_t,
    sys::cudnnConvolutionBwdDataAlgoPerf_t => sys::cudnnConvolutionBwdDataAlgo_t,
    sys::cudnnConvolutionBwdFilterAlgoPerf_t => sys::cudnnConvolutionBwdFilterAlgo_t
);

/// Up to 8 ranked algorithms, zeroed before cuDNN fills `n` of them.
fn ranked<P: AlgoPerf>(
    fill: impl FnOnce(*mut P, &mut i32) -> Status,
    what: &str,
) -> Result<Vec<P>> {
    // SAFETY: the perf structs are plain C data, valid when zeroed.
    let mut perf: Vec<P> = (0..8).map(|_| unsafe { std::mem::zeroed() }).collect();
    let mut n = 0;
    check(what, fill(perf.as_mut_ptr(), &mut n))?;
    perf.truncate(n.clamp(0, 8) as usize);
    Ok(perf)
}

/// The most workspace an algorithm may ask for.
const MAX_WORKSPACE: usize = 1 << 30;

/// A workspace of `bytes` from the caching allocator (none for 0) and its address.
fn workspace(gpu: &Gpu, bytes: usize) -> Result<(Option<DeviceBuffer>, MutPtr)> {
    if bytes == 0 {
        return Ok((None, std::ptr::null_mut()));
    }
    let b = DeviceBuffer::alloc(gpu.ordinal(), bytes)?;
    let p = b.ptr() as MutPtr;
    Ok((Some(b), p))
}

/// Runs a convolution op (`Conv`, `ConvInputGrad`, `ConvWeightGrad`) of device views
/// `args` into `out` through cuDNN. `Ok(false)`: cuDNN does not take this call, nothing was
/// written.
pub fn run(gpu: &Gpu, op: &Op, args: &[Tensor], out: &Out) -> Result<bool> {
    if !enabled() || args.len() < 2 {
        return Ok(false);
    }
    let dtype = args[0].dtype();
    if data_type(dtype).is_none() || args.iter().any(|t| t.dtype() != dtype) {
        return Ok(false);
    }
    // an empty result has nothing to write; empty operands of a non-empty result (a weight
    // gradient over an empty batch) are left to the generated kernel, which writes zeros
    if out.shape.contains(&0) {
        return Ok(true);
    }
    if args.iter().any(|t| t.numel() == 0) {
        return Ok(false);
    }
    let (attrs, kernel) = match op {
        Op::Conv { conv, .. } | Op::ConvInputGrad { conv, .. } => (conv, args[1].shape().get(2..)),
        Op::ConvWeightGrad { conv, .. } => (conv, out.shape.get(2..)),
        _ => return Ok(false),
    };
    let Some(kernel) = kernel else {
        return Ok(false);
    };
    let spatial = attrs.spatial();
    // cuDNN pads both sides alike, and its descriptors hold C ints
    let g = attrs.geometry(kernel)?;
    let ints = [&g.pad_lo, &g.stride, &g.dilation]
        .iter()
        .all(|v| v.iter().all(|&x| fits_int(x)));
    if g.pad_lo != g.pad_hi || !ints || !fits_int(g.groups) {
        return Ok(false);
    }
    let mut keep = Vec::new();
    let (Some(a), Some(b), Some(o)) = (
        view4(&args[0], spatial, &mut keep)?,
        view4(&args[1], spatial, &mut keep)?,
        out_view(out, spatial),
    ) else {
        return Ok(false);
    };
    let api = api().map_err(Error::Device)?;
    // x, y, w of the convolution in each direction
    let (x, y, w) = match op {
        Op::Conv { .. } => (&a, &o, &b),
        Op::ConvInputGrad { .. } => (&o, &a, &b),
        _ => (&b, &a, &o),
    };
    // a shape cuDNN's descriptors refuse goes to the generated kernel
    let Ok(d) = Descs::new(api, dtype, x, y, w, &g, spatial) else {
        return Ok(false);
    };
    let bias = match (op, args.get(2)) {
        (Op::Conv { has_bias: true, .. }, Some(b)) => Some(super::tensor::contiguous(b)?),
        (Op::Conv { has_bias: true, .. }, None) => return Ok(false),
        _ => None,
    };
    let key = format!(
        "{}|{dtype}|{:?}{:?}|{:?}{:?}|{:?}{:?}|{:?}|{:?}|{:?}|{}",
        gpu.ordinal(),
        x.dims,
        x.format,
        w.dims,
        w.format,
        y.dims,
        y.format,
        g.pad_lo,
        g.stride,
        g.dilation,
        g.groups
    );
    let ran = with_handle(gpu, |api, h| {
        let c = Call {
            api,
            h,
            gpu,
            key: &key,
            d: &d,
        };
        match op {
            Op::Conv { .. } => forward(&c, x, w, y, bias.as_ref()),
            Op::ConvInputGrad { .. } => input_grad(&c, x, w, y),
            _ => weight_grad(&c, x, w, y),
        }
    })?;
    if ran {
        CALLS.fetch_add(1, Ordering::Relaxed);
    }
    Ok(ran)
}

/// What one convolution call works with: the library, the device's handle, the device (for
/// workspaces), the key its algorithm is remembered by and its descriptors.
struct Call<'a> {
    api: &'a Api,
    h: sys::cudnnHandle_t,
    gpu: &'a Gpu,
    key: &'a str,
    d: &'a Descs,
}

fn out_view(out: &Out, spatial: usize) -> Option<View4> {
    let (dims, strides) = as_4d(out.shape, out.strides, spatial)?;
    if !fits_int(dims.iter().product()) {
        return None;
    }
    let format = format_of(&dims, &strides)?;
    Some(View4 {
        ptr: out.ptr,
        dims,
        format,
    })
}

fn forward(c: &Call, x: &View4, w: &View4, y: &View4, bias: Option<&Tensor>) -> Result<bool> {
    let (api, h, d) = (c.api, c.h, c.d);
    let rank = || {
        // SAFETY: live handle and descriptors; `perf` has room for the 8 asked for.
        ranked(
            |p, n| unsafe {
                (api.cudnnGetConvolutionForwardAlgorithm_v7)(h, d.x, d.w, d.conv, d.y, 8, n, p)
            },
            "cudnnGetConvolutionForwardAlgorithm_v7",
        )
    };
    let size = |algo| {
        let mut bytes = 0;
        // SAFETY: live handle and descriptors.
        check("cudnnGetConvolutionForwardWorkspaceSize", unsafe {
            (api.cudnnGetConvolutionForwardWorkspaceSize)(
                h, d.x, d.w, d.conv, d.y, algo, &mut bytes,
            )
        })
        .map(|()| bytes)
    };
    let Some((algo, bytes)) = d.choose(c.key, rank, size)? else {
        return Ok(false);
    };
    let (_ws, ws) = workspace(c.gpu, bytes)?;
    let (one, zero) = d.scalars();
    // SAFETY: every pointer addresses a live device view of its descriptor's size.
    check("cudnnConvolutionForward", unsafe {
        (api.cudnnConvolutionForward)(
            h,
            one.as_ptr() as Ptr,
            d.x,
            x.ptr as Ptr,
            d.w,
            w.ptr as Ptr,
            d.conv,
            algo,
            ws,
            bytes,
            zero.as_ptr() as Ptr,
            d.y,
            y.ptr as MutPtr,
        )
    })?;
    if let Some(b) = bias {
        add_bias(api, h, d, b, y, &one)?;
    }
    Ok(true)
}

/// `y += bias`, the bias broadcast over every position of its channel.
fn add_bias(
    api: &Api,
    h: sys::cudnnHandle_t,
    d: &Descs,
    b: &Tensor,
    y: &View4,
    one: &[u8; 8],
) -> Result<()> {
    let bv = View4 {
        ptr: b.storage().device_ptr().unwrap_or(0) + (b.storage_offset() * b.dtype().size()) as u64,
        dims: [1, y.dims[1], 1, 1],
        format: Format::Nchw,
    };
    let dt = data_type(b.dtype()).ok_or_else(|| Error::DType("cuDNN bias".into()))?;
    let bd = tensor_desc(api, dt, &bv)?;
    // SAFETY: live handle and descriptors; `b` is a dense device vector of `y`'s channels.
    let r = unsafe {
        (api.cudnnAddTensor)(
            h,
            one.as_ptr() as Ptr,
            bd,
            bv.ptr as Ptr,
            one.as_ptr() as Ptr,
            d.y,
            y.ptr as MutPtr,
        )
    };
    // SAFETY: created above, destroyed once.
    unsafe { (api.cudnnDestroyTensorDescriptor)(bd) };
    check("cudnnAddTensor", r)
}

/// `x` ← the input's gradient, from `y` (the output's gradient) and the weight.
fn input_grad(c: &Call, x: &View4, w: &View4, y: &View4) -> Result<bool> {
    let (api, h, d) = (c.api, c.h, c.d);
    let rank = || {
        // SAFETY: live handle and descriptors; `perf` has room for the 8 asked for.
        ranked(
            |p, n| unsafe {
                (api.cudnnGetConvolutionBackwardDataAlgorithm_v7)(h, d.w, d.y, d.conv, d.x, 8, n, p)
            },
            "cudnnGetConvolutionBackwardDataAlgorithm_v7",
        )
    };
    let size = |algo| {
        let mut bytes = 0;
        // SAFETY: live handle and descriptors.
        check("cudnnGetConvolutionBackwardDataWorkspaceSize", unsafe {
            (api.cudnnGetConvolutionBackwardDataWorkspaceSize)(
                h, d.w, d.y, d.conv, d.x, algo, &mut bytes,
            )
        })
        .map(|()| bytes)
    };
    let Some((algo, bytes)) = d.choose(c.key, rank, size)? else {
        return Ok(false);
    };
    let (_ws, ws) = workspace(c.gpu, bytes)?;
    let (one, zero) = d.scalars();
    // SAFETY: every pointer addresses a live device view of its descriptor's size.
    check("cudnnConvolutionBackwardData", unsafe {
        (api.cudnnConvolutionBackwardData)(
            h,
            one.as_ptr() as Ptr,
            d.w,
            w.ptr as Ptr,
            d.y,
            y.ptr as Ptr,
            d.conv,
            algo,
            ws,
            bytes,
            zero.as_ptr() as Ptr,
            d.x,
            x.ptr as MutPtr,
        )
    })?;
    Ok(true)
}

/// `w` ← the weight's gradient, from `y` (the output's gradient) and the input `x`.
fn weight_grad(c: &Call, x: &View4, w: &View4, y: &View4) -> Result<bool> {
    let (api, h, d) = (c.api, c.h, c.d);
    let rank = || {
        // SAFETY: live handle and descriptors; `perf` has room for the 8 asked for.
        ranked(
            |p, n| unsafe {
                (api.cudnnGetConvolutionBackwardFilterAlgorithm_v7)(
                    h, d.x, d.y, d.conv, d.w, 8, n, p,
                )
            },
            "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
        )
    };
    let size = |algo| {
        let mut bytes = 0;
        // SAFETY: live handle and descriptors.
        check("cudnnGetConvolutionBackwardFilterWorkspaceSize", unsafe {
            (api.cudnnGetConvolutionBackwardFilterWorkspaceSize)(
                h, d.x, d.y, d.conv, d.w, algo, &mut bytes,
            )
        })
        .map(|()| bytes)
    };
    let Some((algo, bytes)) = d.choose(c.key, rank, size)? else {
        return Ok(false);
    };
    let (_ws, ws) = workspace(c.gpu, bytes)?;
    let (one, zero) = d.scalars();
    // SAFETY: every pointer addresses a live device view of its descriptor's size.
    check("cudnnConvolutionBackwardFilter", unsafe {
        (api.cudnnConvolutionBackwardFilter)(
            h,
            one.as_ptr() as Ptr,
            d.x,
            x.ptr as Ptr,
            d.y,
            y.ptr as Ptr,
            d.conv,
            algo,
            ws,
            bytes,
            zero.as_ptr() as Ptr,
            d.w,
            w.ptr as MutPtr,
        )
    })?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operands_are_seen_as_packed_4d_views() {
        // a 1-d batched input [2, 3, 5]: height 1 inserted
        let (d, s) = as_4d(&[2, 3, 5], &[15, 5, 1], 1).unwrap();
        assert_eq!(d, [2, 3, 1, 5]);
        assert_eq!(format_of(&d, &s), Some(Format::Nchw));
        // unbatched 2-d [3, 4, 5]
        let (d, s) = as_4d(&[3, 4, 5], &[20, 5, 1], 2).unwrap();
        assert_eq!(d, [1, 3, 4, 5]);
        assert_eq!(format_of(&d, &s), Some(Format::Nchw));
        // channels_last [2, 3, 4, 5]: strides [60, 1, 15, 3]
        assert_eq!(
            format_of(&[2, 3, 4, 5], &[60, 1, 15, 3]),
            Some(Format::Nhwc)
        );
        // a transposed view is neither
        assert_eq!(format_of(&[2, 3, 4, 5], &[60, 20, 1, 4]), None);
        // a wrong rank is not taken
        assert!(as_4d(&[2, 3, 4, 5], &[60, 20, 5, 1], 1).is_none());
        // sizes past a C int go to the generated kernels, whose indices are 64-bit
        assert!(fits_int(i32::MAX as usize) && !fits_int(i32::MAX as usize + 1));
        let big = Out {
            ptr: 0,
            shape: &[1 << 16, 1 << 8, 1 << 8],
            strides: &[1 << 16, 1 << 8, 1],
        };
        assert!(out_view(&big, 1).is_none());
    }
}
