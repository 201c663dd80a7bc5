//! Creation functions, random tensors and the `tensor!` literal.

use half::{bf16, f16};
use smelt::macros::Nested;
use smelt::{DType, Generator, Scalar, Tensor, tensor};
use std::sync::Mutex;

/// Tests that draw from the global generator hold this, so that they do not interleave.
static GLOBAL_RNG: Mutex<()> = Mutex::new(());

fn global_rng() -> std::sync::MutexGuard<'static, ()> {
    GLOBAL_RNG.lock().unwrap_or_else(|e| e.into_inner())
}

// ---- linspace, eye, arange, full ------------------------------------------------------

#[test]
fn linspace_hits_both_ends_exactly() {
    let t = Tensor::linspace(0.0, 1.0, 5, None).unwrap();
    assert_eq!(t.dtype(), DType::F32);
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![0.0, 0.25, 0.5, 0.75, 1.0]);
    for steps in [2usize, 3, 7, 10, 101] {
        let (a, b) = (-1.3f64, 2.9f64);
        let v = Tensor::linspace(a, b, steps, Some(DType::F64))
            .unwrap()
            .to_vec::<f64>()
            .unwrap();
        assert_eq!(v.len(), steps);
        assert_eq!(v[0], a);
        assert_eq!(v[steps - 1], b);
        for (i, x) in v.iter().enumerate() {
            let expect = a + (b - a) * i as f64 / (steps - 1) as f64;
            assert!((x - expect).abs() < 1e-12, "{steps} {i}: {x} vs {expect}");
        }
    }
}

#[test]
fn linspace_counts_the_second_half_down_from_end() {
    // first half from start, second half from end: a symmetric range is exactly antisymmetric
    for steps in [4usize, 5, 10, 11] {
        let v = Tensor::linspace(-1.0, 1.0, steps, None)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        for i in 0..steps {
            assert_eq!(v[i], -v[steps - 1 - i], "steps {steps} index {i}");
        }
    }
}

#[test]
fn linspace_edge_counts_and_dtypes() {
    let e = Tensor::linspace(0.0, 10.0, 0, None).unwrap();
    assert_eq!(e.shape(), &[0]);
    let one = Tensor::linspace(3.5, 10.0, 1, None).unwrap();
    assert_eq!(one.to_vec::<f32>().unwrap(), vec![3.5]);
    // integer dtypes compute the step in double and truncate
    let i = Tensor::linspace(0, 10, 4, Some(DType::I64)).unwrap();
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![0, 3, 6, 10]);
    let d = Tensor::linspace(10, 0, 3, Some(DType::I32)).unwrap();
    assert_eq!(d.to_vec::<i32>().unwrap(), vec![10, 5, 0]);
    let h = Tensor::linspace(0.0, 1.0, 3, Some(DType::F16)).unwrap();
    assert_eq!(
        h.to_vec::<f16>().unwrap(),
        vec![f16::from_f32(0.0), f16::from_f32(0.5), f16::from_f32(1.0)]
    );
    let b = Tensor::linspace(0.0, 0.3, 2, Some(DType::BF16)).unwrap();
    assert_eq!(b.to_vec::<bf16>().unwrap()[1], bf16::from_f64(0.3));
}

#[test]
fn eye_square_rectangular_and_empty() {
    let t = Tensor::eye(3, None, None).unwrap();
    assert_eq!(t.dtype(), DType::F32);
    assert_eq!(t.shape(), &[3, 3]);
    let v = t.to_vec::<f32>().unwrap();
    for r in 0..3 {
        for c in 0..3 {
            assert_eq!(v[r * 3 + c], if r == c { 1.0 } else { 0.0 });
        }
    }
    let r = Tensor::eye(2, Some(3), Some(DType::I64)).unwrap();
    assert_eq!(r.to_vec::<i64>().unwrap(), vec![1, 0, 0, 0, 1, 0]);
    let tall = Tensor::eye(3, Some(2), Some(DType::Bool)).unwrap();
    assert_eq!(
        tall.to_vec::<bool>().unwrap(),
        vec![true, false, false, true, false, false]
    );
    assert_eq!(Tensor::eye(0, None, None).unwrap().shape(), &[0, 0]);
    assert_eq!(Tensor::eye(2, Some(0), None).unwrap().shape(), &[2, 0]);
}

#[test]
fn arange_lengths_follow_ceil_of_span_over_step() {
    let t = Tensor::arange(0, 1, 0.1, None).unwrap();
    assert_eq!(t.dtype(), DType::F32);
    assert_eq!(t.numel(), 10);
    let v = t.to_vec::<f32>().unwrap();
    for (i, x) in v.iter().enumerate() {
        assert_eq!(*x, (i as f64 * 0.1) as f32);
    }
    for (s, e, st) in [
        (0.0f64, 1.05, 0.25),
        (1.0, 2.5, 0.5),
        (-1.0, -2.0, -0.5),
        (0.0, 10.0, 3.0),
        (0.0, 0.5, 1.0),
    ] {
        let n = Tensor::arange(s, e, st, None).unwrap().numel();
        assert_eq!(n, ((e - s) / st).ceil() as usize, "arange({s}, {e}, {st})");
    }
    assert_eq!(
        Tensor::arange(1.0, 2.5, 0.5, None)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![1.0, 1.5, 2.0]
    );
    assert_eq!(
        Tensor::arange(-1.0, -2.0, -0.5, None)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![-1.0, -1.5]
    );
}

#[test]
fn arange_integers_and_negative_steps() {
    let t = Tensor::arange(0, 10, 3, None).unwrap();
    assert_eq!(t.dtype(), DType::I64);
    assert_eq!(t.to_vec::<i64>().unwrap(), vec![0, 3, 6, 9]);
    assert_eq!(
        Tensor::arange(10, 0, -3, None)
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![10, 7, 4, 1]
    );
    let d = Tensor::arange(0, 3, 1, Some(DType::F64)).unwrap();
    assert_eq!(d.to_vec::<f64>().unwrap(), vec![0.0, 1.0, 2.0]);
    assert_eq!(
        Tensor::arange(0, 5, 0, None).unwrap_err().to_string(),
        "step must be nonzero"
    );
    assert_eq!(
        Tensor::arange(0, 5, -1, None).unwrap_err().to_string(),
        "upper bound and larger bound inconsistent with step sign"
    );
}

#[test]
fn full_infers_dtype_from_the_value() {
    assert_eq!(Tensor::full(&[2], 1, None).unwrap().dtype(), DType::I64);
    assert_eq!(Tensor::full(&[2], 1.0, None).unwrap().dtype(), DType::F32);
    assert_eq!(Tensor::full(&[2], true, None).unwrap().dtype(), DType::Bool);
    let f = Tensor::full(&[2, 2], 2.5, Some(DType::F64)).unwrap();
    assert_eq!(f.to_vec::<f64>().unwrap(), vec![2.5; 4]);
    assert_eq!(
        Tensor::full(&[3], 7, None)
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![7; 3]
    );
    // -0.0 equals zero but is its own value, as in torch.full((3,), -0.0)
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let z = Tensor::full(&[3], -0.0, Some(dtype)).unwrap().to_f64_vec();
        assert!(
            z.iter().all(|v| v.to_bits() == (-0.0f64).to_bits()),
            "{dtype:?}: {z:?}"
        );
    }
}

// ---- random tensors -------------------------------------------------------------------

#[test]
fn manual_seed_reproduces_every_kind_of_draw() {
    let _g = global_rng();
    let draw = || {
        (
            Tensor::rand(&[50], None).unwrap().to_vec::<f32>().unwrap(),
            Tensor::randn(&[2, 25], Some(DType::F64))
                .unwrap()
                .to_vec::<f64>()
                .unwrap(),
            Tensor::randint(0, 1000, &[50], None)
                .unwrap()
                .to_vec::<i64>()
                .unwrap(),
        )
    };
    smelt::manual_seed(42);
    let a = draw();
    Tensor::manual_seed(42);
    let b = draw();
    assert_eq!(a, b);
    smelt::manual_seed(43);
    let c = draw();
    assert_ne!(a.0, c.0);
    assert_ne!(a.1, c.1);
    assert_eq!(smelt::runtime::random::initial_seed(), 43);
}

#[test]
fn explicit_generators_are_independent_of_the_global_one() {
    let _g = global_rng();
    let mut g1 = Generator::new(7);
    let mut g2 = Generator::new(7);
    let a = Tensor::rand_with(&[100], None, &mut g1)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    smelt::manual_seed(1);
    let _ = Tensor::rand(&[10], None).unwrap();
    let b = Tensor::rand_with(&[100], None, &mut g2)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(a, b);
    // a generator continues its sequence, and reseeding restarts it
    let next = Tensor::rand_with(&[100], None, &mut g1)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_ne!(a, next);
    g1.manual_seed(7);
    assert_eq!(g1.initial_seed(), 7);
    assert_eq!(
        Tensor::rand_with(&[100], None, &mut g1)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        a
    );
    // drawing from a generator leaves the global sequence alone
    smelt::manual_seed(5);
    let x = Tensor::randn(&[20], None).unwrap().to_vec::<f32>().unwrap();
    smelt::manual_seed(5);
    let _ = Tensor::randn_with(&[20], None, &mut g2).unwrap();
    let _ = Tensor::randint_with(0, 3, &[20], None, &mut g2).unwrap();
    assert_eq!(
        Tensor::randn(&[20], None).unwrap().to_vec::<f32>().unwrap(),
        x
    );
}

#[test]
fn rand_is_uniform_in_zero_one() {
    let mut g = Generator::new(2024);
    let v = Tensor::rand_with(&[100_000], None, &mut g)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert!(v.iter().all(|&x| (0.0..1.0).contains(&x)));
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
    // the standard error of the mean is 0.0009
    assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
    let below_tenth = v.iter().filter(|&&x| x < 0.1).count();
    assert!((9_000..11_000).contains(&below_tenth), "{below_tenth}");
}

#[test]
fn rand_in_every_float_dtype_stays_below_one() {
    let mut g = Generator::new(3);
    for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        let t = Tensor::rand_with(&[4000], Some(dtype), &mut g).unwrap();
        assert_eq!(t.dtype(), dtype);
        let v = t.to_f64_vec();
        assert!(v.iter().all(|&x| (0.0..1.0).contains(&x)), "{dtype}");
        assert!(
            v.iter().any(|&x| x > 0.9) && v.iter().any(|&x| x < 0.1),
            "{dtype}"
        );
    }
    let h = Tensor::rand_with(&[1000], Some(DType::F16), &mut g)
        .unwrap()
        .to_f64_vec();
    // f16 samples are multiples of 2^-11, so exactly representable
    assert!(h.iter().all(|&x| (x * 2048.0).fract() == 0.0));
}

#[test]
fn randn_has_zero_mean_and_unit_std() {
    let mut g = Generator::new(99);
    for dtype in [DType::F32, DType::F64] {
        let v = Tensor::randn_with(&[100_000], Some(dtype), &mut g)
            .unwrap()
            .to_f64_vec();
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        // standard errors: 0.0032 for the mean, 0.0023 for the std
        assert!(mean.abs() < 0.03, "{dtype} mean {mean}");
        assert!(
            (var.sqrt() - 1.0).abs() < 0.03,
            "{dtype} std {}",
            var.sqrt()
        );
        assert!(v.iter().any(|&x| x < -3.0) && v.iter().any(|&x| x > 3.0));
    }
    let h = Tensor::randn_with(&[10], Some(DType::BF16), &mut g).unwrap();
    assert_eq!(h.dtype(), DType::BF16);
}

#[test]
fn rand_and_randn_refuse_integer_dtypes() {
    let e = Tensor::rand(&[2], Some(DType::I64))
        .unwrap_err()
        .to_string();
    assert_eq!(e, "\"check_uniform_bounds\" not implemented for 'Long'");
    let e = Tensor::randn(&[2], Some(DType::Bool))
        .unwrap_err()
        .to_string();
    assert_eq!(e, "\"normal_kernel_cpu\" not implemented for 'Bool'");
    let x = Tensor::zeros(&[2], DType::I32);
    assert_eq!(
        x.rand_like().unwrap_err().to_string(),
        "\"check_uniform_bounds\" not implemented for 'Int'"
    );
    assert!(x.randn_like().is_err());
}

#[test]
fn randint_stays_in_its_half_open_range() {
    let mut g = Generator::new(11);
    let t = Tensor::randint_with(-2, 3, &[1000], None, &mut g).unwrap();
    assert_eq!(t.dtype(), DType::I64);
    let v = t.to_vec::<i64>().unwrap();
    assert!(v.iter().all(|x| (-2..3).contains(x)));
    for k in -2..3 {
        assert!(v.contains(&k), "{k} never drawn");
    }
    let u = Tensor::randint_with(250, 256, &[200], Some(DType::U8), &mut g).unwrap();
    assert!(u.to_vec::<u8>().unwrap().iter().all(|&x| x >= 250));
    let f = Tensor::randint_with(0, 4, &[100], Some(DType::F32), &mut g).unwrap();
    assert!(
        f.to_vec::<f32>()
            .unwrap()
            .iter()
            .all(|&x| x.fract() == 0.0 && (0.0..4.0).contains(&x))
    );
    let b = Tensor::randint_with(0, 2, &[100], Some(DType::Bool), &mut g).unwrap();
    let bv = b.to_vec::<bool>().unwrap();
    assert!(bv.contains(&true) && bv.contains(&false));
    let wide = Tensor::randint_with(i64::MIN, i64::MAX, &[10], None, &mut g).unwrap();
    assert_eq!(wide.numel(), 10);
}

#[test]
fn randint_errors_match_pytorch() {
    let e = Tensor::randint(5, 5, &[2], None).unwrap_err().to_string();
    assert_eq!(
        e,
        "random_ expects 'from' to be less than 'to', but got from=5 >= to=5"
    );
    let e = Tensor::randint(0, 300, &[2], Some(DType::U8))
        .unwrap_err()
        .to_string();
    assert_eq!(e, "to - 1 is out of bounds for Byte");
    let e = Tensor::randint(-1, 3, &[2], Some(DType::U8))
        .unwrap_err()
        .to_string();
    assert_eq!(e, "from is out of bounds for Byte");
    let e = Tensor::randint(0, 3, &[2], Some(DType::Bool))
        .unwrap_err()
        .to_string();
    assert_eq!(e, "to - 1 is out of bounds for Bool");
}

#[test]
fn like_forms_keep_shape_and_dtype() {
    let _g = global_rng();
    let x = Tensor::zeros(&[2, 3], DType::F16).t().unwrap();
    for t in [
        x.rand_like().unwrap(),
        x.randn_like().unwrap(),
        x.randint_like(0, 5).unwrap(),
    ] {
        assert_eq!(t.shape(), &[3, 2]);
        assert_eq!(t.dtype(), DType::F16);
        assert!(t.is_contiguous());
    }
    let i = Tensor::zeros(&[4], DType::I32).randint_like(0, 3).unwrap();
    assert_eq!(i.dtype(), DType::I32);
    assert!(
        i.to_vec::<i32>()
            .unwrap()
            .iter()
            .all(|x| (0..3).contains(x))
    );
    let empty = Tensor::rand(&[0, 3], None).unwrap();
    assert_eq!(empty.shape(), &[0, 3]);
    assert_eq!(Tensor::randn(&[], None).unwrap().numel(), 1);
}

// ---- tensor! --------------------------------------------------------------------------

#[test]
fn tensor_literal_shapes_and_dtypes() {
    let a = tensor![1.0, 2.0].unwrap();
    assert_eq!((a.shape(), a.dtype()), (&[2usize][..], DType::F32));
    let b = tensor![[1, 2], [3, 4]].unwrap();
    assert_eq!((b.shape(), b.dtype()), (&[2usize, 2][..], DType::I64));
    assert_eq!(b.to_vec::<i64>().unwrap(), vec![1, 2, 3, 4]);
    let c = tensor![[true, false]].unwrap();
    assert_eq!((c.shape(), c.dtype()), (&[1usize, 2][..], DType::Bool));
    let d = tensor![
        [[1.5, -2.0], [3.0, 4.0]],
        [[5.0, 6.0], [7.0, 8.0]],
        [[9.0, 10.0], [11.0, 12.0]]
    ]
    .unwrap();
    assert_eq!(d.shape(), &[3, 2, 2]);
    assert_eq!(d.to_vec::<f32>().unwrap()[..3], [1.5, -2.0, 3.0]);
    let e = tensor![].unwrap();
    assert_eq!((e.shape(), e.dtype()), (&[0usize][..], DType::F32));
    let trailing = tensor![[1, 2,], [3, 4],].unwrap();
    assert_eq!(trailing.shape(), &[2, 2]);
}

#[test]
fn tensor_literal_promotes_mixed_values_and_takes_expressions() {
    let m = tensor![1, 2.5].unwrap();
    assert_eq!(m.dtype(), DType::F32);
    assert_eq!(m.to_vec::<f32>().unwrap(), vec![1.0, 2.5]);
    let bi = tensor![true, 3].unwrap();
    assert_eq!(bi.to_vec::<i64>().unwrap(), vec![1, 3]);
    let x = 0.5f32;
    let n = 4i64;
    let t = tensor![[x * 2.0, -x], [n as f32, 1.0 / 4.0]].unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, -0.5, 4.0, 0.25]);
    let neg = tensor![-1, -2].unwrap();
    assert_eq!(neg.to_vec::<i64>().unwrap(), vec![-1, -2]);
}

#[test]
fn ragged_literals_are_errors() {
    let e = tensor![[1, 2], [3]].unwrap_err().to_string();
    assert_eq!(e, "expected sequence of length 2 at dim 1 (got 1)");
    let e = tensor![[[1], [2]], [[3], [4, 5]]].unwrap_err().to_string();
    assert_eq!(e, "expected sequence of length 1 at dim 2 (got 2)");
    assert!(tensor![[1, 2], 3].is_err());
    assert!(tensor![1, [2, 3]].is_err());
    assert!(tensor![[], [1]].is_err());
}

#[test]
fn nested_vectors_report_shape_and_data() {
    let n: Nested = vec![vec![1.0, 2.0], vec![3.0, 4.0], vec![5.0, 6.0]].into();
    let (shape, data) = n.shape_and_data().unwrap();
    assert_eq!(shape, vec![3, 2]);
    assert_eq!(data[5], Scalar::Float(6.0));
    let t = Tensor::from_nested([[1u8, 2], [3, 4]]).unwrap();
    assert_eq!(t.dtype(), DType::I64);
    assert_eq!(t.shape(), &[2, 2]);
    let empty_rows = Tensor::from_nested(vec![Vec::<f64>::new(), Vec::new()]).unwrap();
    assert_eq!(empty_rows.shape(), &[2, 0]);
    let ragged: Nested = vec![vec![1], vec![2, 3]].into();
    assert!(ragged.shape_and_data().is_err());
    assert_eq!(Tensor::from_nested(2.5).unwrap().shape(), &[] as &[usize]);
}

#[test]
fn too_large_results_are_errors_not_aborts() {
    for size in [&[1usize << 62][..], &[1 << 40, 1 << 40][..]] {
        let e = Tensor::full(size, 1.0, Some(DType::F32))
            .unwrap_err()
            .to_string();
        assert!(e.contains("too large"), "{e}");
    }
    let x = Tensor::full(&[1], 1.0, None).unwrap();
    // an expanded view costs nothing; materialising it is refused
    let big = x.expand(&[1i64 << 31, 1 << 31]).unwrap();
    let e = smelt::runtime::apply(smelt::ir::op::Op::Contiguous, &[&big]).unwrap_err();
    assert!(e.to_string().contains("too large"), "{e}");
}

/// 4 PiB fits the size arithmetic but no machine's memory: the allocation fails, and that is
/// PyTorch's "can't allocate memory" error for every creation path, not an abort.
#[test]
fn allocations_memory_cannot_hold_are_errors() {
    let size = [1usize << 25, 1 << 25];
    let check_bytes = |what: &str, r: smelt::Result<Tensor>, bytes: u64| match r {
        Err(smelt::Error::OutOfMemory(m)) => assert!(
            m.contains("can't allocate memory") && m.contains(&format!(" {bytes} bytes")),
            "{what}: {m}"
        ),
        Err(e) => panic!("{what}: not an allocation error: {e}"),
        Ok(_) => panic!("{what}: {bytes} bytes were allocated"),
    };
    let check = |what: &str, r: smelt::Result<Tensor>| check_bytes(what, r, 1 << 52);
    check("full", Tensor::full(&size, 0.5, None));
    check("randn", Tensor::randn(&size, None));
    check("rand", Tensor::rand(&size, None));
    check("randint", Tensor::randint(0, 9, &size, Some(DType::I32)));
    let x = Tensor::full(&[3], 1.0, None).unwrap();
    let wide = x.expand(&[1i64 << 50, 3]).unwrap();
    check_bytes("relu of an expanded view", wide.relu(), 3 << 52);
    check_bytes("contiguous", wide.contiguous(), 3 << 52);
    // the process goes on allocating normally afterwards
    assert_eq!(Tensor::full(&[2], 1.0, None).unwrap().numel(), 2);
}

/// Memory lent by another library (as DLPack lends it): the tensor reads and writes it in
/// place, views of it share it, and the owner's guard is dropped with the last tensor.
#[test]
fn foreign_memory_is_viewed_in_place_and_handed_back_once() {
    use smelt::layout::Layout;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Owner(#[allow(dead_code)] Vec<f32>, Arc<AtomicUsize>);
    impl Drop for Owner {
        fn drop(&mut self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }
    let dropped = Arc::new(AtomicUsize::new(0));
    let mut data: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let ptr = data.as_mut_ptr() as *mut u8;
    // a 3×2 transposed view of a 2×3 block that starts at element 1 (column stride 1,
    // row stride 4, as a sliced and transposed NumPy array would lend it)
    let layout = Layout {
        shape: vec![3, 2],
        strides: vec![1, 4],
        offset: 1,
    };
    let owner = Box::new(Owner(data, dropped.clone()));
    let t = unsafe { Tensor::from_foreign(ptr, DType::F32, layout, owner) }.unwrap();
    assert_eq!(t.to_f64_vec(), vec![1.0, 5.0, 2.0, 6.0, 3.0, 7.0]);
    assert_eq!(t.data_ptr(), ptr as usize + 4);
    let v = t.t().unwrap();
    assert_eq!(v.to_f64_vec(), vec![1.0, 2.0, 3.0, 5.0, 6.0, 7.0]);
    // an in-place write lands in the lent memory, seen through the other view
    t.select(0, 0).unwrap().fill_(-1.0).unwrap();
    assert_eq!(v.to_f64_vec(), vec![-1.0, 2.0, 3.0, -1.0, 6.0, 7.0]);
    drop(t);
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        0,
        "a view still holds the memory"
    );
    drop(v);
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
}

#[test]
fn foreign_memory_refuses_bad_pointers_and_layouts() {
    use smelt::layout::Layout;
    let layout = |shape: Vec<usize>, strides: Vec<usize>| Layout {
        shape,
        strides,
        offset: 0,
    };
    let mut buf = vec![0u64; 4];
    let p = buf.as_mut_ptr() as *mut u8;
    let misaligned = unsafe {
        Tensor::from_foreign(
            p.wrapping_add(1),
            DType::F32,
            layout(vec![2], vec![1]),
            Box::new(()),
        )
    };
    assert!(misaligned.unwrap_err().to_string().contains("not aligned"));
    let null = unsafe {
        Tensor::from_foreign(
            std::ptr::null_mut(),
            DType::F32,
            layout(vec![2], vec![1]),
            Box::new(()),
        )
    };
    assert!(null.unwrap_err().to_string().contains("null"));
    let empty = unsafe {
        Tensor::from_foreign(
            std::ptr::null_mut(),
            DType::F32,
            layout(vec![0, 3], vec![3, 1]),
            Box::new(()),
        )
    };
    assert_eq!(empty.unwrap().shape(), &[0, 3]);
    let overflow = unsafe {
        Tensor::from_foreign(
            p,
            DType::F32,
            layout(vec![2, 2], vec![usize::MAX / 2, 1]),
            Box::new(()),
        )
    };
    assert!(overflow.is_err());
    let ranks =
        unsafe { Tensor::from_foreign(p, DType::F32, layout(vec![2], vec![]), Box::new(())) };
    assert!(ranks.unwrap_err().to_string().contains("strides"));
}
