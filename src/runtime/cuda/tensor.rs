//! Tensors in GPU memory: copies between host and device, and dense copies of views.

use super::copy;
use super::driver::Gpu;
use super::memory::DeviceBuffer;
use super::stream::{Event, Stream};
use crate::Result;
use crate::runtime::access;
use crate::runtime::device::Device;
use crate::runtime::layout::Layout;
use crate::runtime::storage::Storage;
use crate::runtime::tensor::Tensor;
use std::sync::Arc;

fn ordinal(t: &Tensor) -> Result<usize> {
    match t.device() {
        Device::Cuda(i) => Ok(i),
        Device::Cpu => crate::bail!(Device, "expected a CUDA tensor, got a cpu one"),
    }
}

/// A dense copy of host tensor `t` on GPU `device`.
pub fn upload(t: &Tensor, device: usize) -> Result<Tensor> {
    let gpu = Gpu::get(device)?;
    let c = crate::runtime::kernels::copy::contiguous(t)?;
    let st = Storage::cuda_for_overwrite(device, c.dtype(), c.numel())?;
    let nbytes = c.numel() * c.element_size();
    {
        let acc = access::lock(&[&c], &[]);
        // SAFETY: `c` is contiguous: its numel elements follow the first one.
        let bytes = unsafe { std::slice::from_raw_parts(acc.read::<u8>(0), nbytes) };
        gpu.htod(st.device_ptr().unwrap_or(0), bytes)?;
    }
    Ok(Tensor::from_parts(
        Arc::new(st),
        Layout::contiguous(t.shape()),
    ))
}

/// A copy of host tensor `t` on GPU `device`, queued on the thread's current stream without
/// waiting for it when `t` is dense and pinned (PyTorch's `non_blocking=True`); the copy
/// keeps `t`'s memory alive. Otherwise as [`upload`].
pub fn upload_non_blocking(t: &Tensor, device: usize) -> Result<Tensor> {
    if !t.is_pinned() || !t.is_contiguous() {
        return upload(t, device);
    }
    let gpu = Gpu::get(device)?;
    let nbytes = t.numel() * t.element_size();
    let mut buf = DeviceBuffer::alloc(device, nbytes)?;
    let copied = Event::on(&gpu, false)?;
    {
        let acc = access::lock(&[t], &[]);
        // SAFETY: `t` is contiguous: its numel elements follow the first one. Its storage is
        // page-locked and kept alive by `buf` below, so it outlives the copy.
        unsafe {
            let bytes = std::slice::from_raw_parts(acc.read::<u8>(0), nbytes);
            gpu.htod_async(buf.ptr(), bytes)?;
        }
    }
    if let Err(e) = copied.record_current() {
        // without the event, wait here: the caller may free the source next
        let _ = gpu.synchronize();
        return Err(e);
    }
    buf.keep_alive(t.storage_arc().clone(), copied);
    Ok(Tensor::from_parts(
        Arc::new(Storage::from_device(buf, t.dtype())),
        Layout::contiguous(t.shape()),
    ))
}

/// Tells the allocator that work on `stream` uses GPU tensor `t` (PyTorch's
/// `record_stream`): its memory is not handed out again before that work is done.
pub fn record_stream(t: &Tensor, stream: &Stream) -> Result<()> {
    let device = ordinal(t)?;
    if device != stream.device() {
        crate::bail!(
            Device,
            "record_stream: the tensor is on cuda:{device} but the stream on cuda:{}",
            stream.device()
        );
    }
    match t.storage().device_buffer() {
        Some(b) => b.record_stream(stream.id()),
        None => Ok(()),
    }
}

/// A dense host copy of GPU tensor `t` (waits for the work that writes it).
pub fn download(t: &Tensor) -> Result<Tensor> {
    let gpu = Gpu::get(ordinal(t)?)?;
    let c = contiguous(t)?;
    let out = Tensor::alloc_for_overwrite(c.dtype(), c.shape())?;
    let nbytes = c.numel() * c.element_size();
    let src =
        c.storage().device_ptr().unwrap_or(0) + (c.storage_offset() * c.element_size()) as u64;
    {
        let acc = access::lock(&[], &[&out]);
        // SAFETY: `out` is a fresh contiguous tensor of exactly `nbytes`.
        let bytes = unsafe { std::slice::from_raw_parts_mut(acc.write::<u8>(0), nbytes) };
        gpu.dtoh(bytes, src)?;
    }
    Ok(out)
}

/// `t` itself when contiguous, else a dense copy on its GPU.
pub fn contiguous(t: &Tensor) -> Result<Tensor> {
    if t.is_contiguous() {
        return Ok(t.clone());
    }
    contiguous_copy(t)
}

/// A dense copy of GPU tensor `t`, always a new storage.
pub fn contiguous_copy(t: &Tensor) -> Result<Tensor> {
    let device = ordinal(t)?;
    let gpu = Gpu::get(device)?;
    let st = Arc::new(Storage::cuda_for_overwrite(device, t.dtype(), t.numel())?);
    let dst = Layout::contiguous(t.shape());
    copy::strided(
        &gpu,
        t.element_size(),
        st.device_ptr().unwrap_or(0),
        &dst,
        t.storage().device_ptr().unwrap_or(0),
        t.layout(),
    )?;
    Ok(Tensor::from_parts(st, dst))
}

/// Writes GPU tensor `src` (same dtype, `dst`'s shape or broadcastable to it) into the
/// elements of GPU tensor `dst`, through its layout.
pub fn copy_into(dst: &Tensor, src: &Tensor) -> Result<()> {
    let gpu = Gpu::get(ordinal(dst)?)?;
    let src_layout = Layout {
        shape: dst.shape().to_vec(),
        strides: src.layout().broadcast_strides(dst.shape()),
        offset: src.storage_offset(),
    };
    copy::strided(
        &gpu,
        dst.element_size(),
        dst.storage().device_ptr().unwrap_or(0),
        dst.layout(),
        src.storage().device_ptr().unwrap_or(0),
        &src_layout,
    )?;
    dst.bump_version();
    Ok(())
}
