//! Device queries and memory on machines with or without a GPU: without a driver every call
//! returns a clear error (or false), never a panic; with a GPU the answers are checked
//! against each other and the caching allocator is exercised on real memory.

use smelt::runtime::cuda::{self, memory};

/// Whether a GPU test may skip: not when `SMELT_REQUIRE_GPU=1` (the GPU machine's runs),
/// where a missing device is a failure.
fn skip_without_gpu(test: &str) -> bool {
    if cuda::is_available() {
        return false;
    }
    if std::env::var("SMELT_REQUIRE_GPU").as_deref() == Ok("1") {
        panic!("{test}: SMELT_REQUIRE_GPU=1 but no CUDA device is here");
    }
    eprintln!("{test}: skipped, no CUDA device");
    true
}

#[test]
fn device_queries_never_panic_and_agree() {
    let available = cuda::is_available();
    if std::env::var("SMELT_REQUIRE_GPU").as_deref() == Ok("1") {
        assert!(available, "SMELT_REQUIRE_GPU=1 but no CUDA device is here");
    }
    match cuda::device_count() {
        Ok(n) => {
            assert_eq!(available, n > 0);
            for i in 0..n {
                assert!(!cuda::device_name(i).unwrap().is_empty());
                let (major, _) = cuda::compute_capability(i).unwrap();
                assert!(major >= 3);
                assert!(cuda::multiprocessor_count(i).unwrap() > 0);
                assert!(cuda::total_memory(i).unwrap() > 0);
            }
            let e = cuda::device_name(n).unwrap_err().to_string();
            assert!(e.contains(&format!("invalid device ordinal {n}")), "{e}");
        }
        Err(e) => {
            assert!(!available);
            let msg = e.to_string();
            eprintln!("no CUDA device here: {msg}");
            assert!(!msg.is_empty());
            // every query says the same thing instead of panicking
            for r in [
                cuda::device_name(0).map(|_| ()),
                cuda::compute_capability(0).map(|_| ()),
                cuda::total_memory(0).map(|_| ()),
                memory::memory_allocated(0).map(|_| ()),
                memory::DeviceBuffer::alloc(0, 16).map(|_| ()),
            ] {
                assert!(r.is_err());
            }
        }
    }
}

#[test]
fn the_environment_report_names_every_part() {
    let r = cuda::environment_report();
    eprintln!("{r}");
    for part in ["driver: ", "devices: ", "nvrtc: ", "headers: ", "cudnn: "] {
        assert!(r.contains(part), "{r}");
    }
    if !cuda::is_available() {
        assert!(r.contains("devices: 0"), "{r}");
    }
}

#[test]
fn device_memory_is_cached_and_counted() {
    if skip_without_gpu("device_memory_is_cached_and_counted") {
        return;
    }
    let before = memory::memory_allocated(0).unwrap();
    let b = memory::DeviceBuffer::alloc(0, 3 << 20).unwrap();
    assert_ne!(b.ptr(), 0);
    assert_eq!(memory::memory_allocated(0).unwrap(), before + (4 << 20));
    let ptr = b.ptr();
    drop(b);
    assert_eq!(memory::memory_allocated(0).unwrap(), before);
    let c = memory::DeviceBuffer::alloc(0, 3 << 20).unwrap();
    assert_eq!(c.ptr(), ptr, "the freed block is reused");
    drop(c);
    memory::empty_cache(0).unwrap();
    let e = memory::DeviceBuffer::alloc(0, 1 << 50)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("CUDA out of memory. Tried to allocate"), "{e}");
}
