//! Tests of the device code that need tensors: the GPU kernels' plans, run on the host,
//! against the eager kernels.

use crate::device::cuda::blas::{GemmCall, Geom, plan, readable};
use crate::device::cuda::copy::{Geo, geometry};
use crate::ir::dtype::DType;
use crate::runtime::layout::Layout;

/// The kernel's loop on the host: element `i` of the walk, its two offsets.
fn emulate_copy(g: &Geo, dst: &mut [i64], src: &[i64]) {
    for i in 0..g.n {
        let (mut r, mut od, mut os) = (i, g.doff, g.soff);
        for k in (0..g.ndim as usize).rev() {
            let p = r % g.size[k];
            r /= g.size[k];
            od += p * g.dst[k];
            os += p * g.src[k];
        }
        dst[od as usize] = src[os as usize];
    }
}

#[test]
fn the_walk_copies_views_as_the_cpu_does() {
    let base = crate::Tensor::arange(0, 120, 1, None)
        .unwrap()
        .reshape(&[2, 3, 4, 5])
        .unwrap();
    let views = [
        base.clone(),
        base.permute(&[3, 1, 0, 2]).unwrap(),
        base.slice(3, Some(1), Some(5), 2)
            .unwrap()
            .select(1, 2)
            .unwrap(),
        base.narrow(2, 1, 1).unwrap().transpose(0, 3).unwrap(),
        base.select(0, 1)
            .unwrap()
            .select(0, 0)
            .unwrap()
            .select(0, 3)
            .unwrap(),
    ];
    let storage: Vec<i64> = (0..120).collect();
    for v in views {
        let dst = Layout::contiguous(v.shape());
        let g = geometry(&dst, v.layout()).unwrap();
        let mut out = vec![-1i64; v.numel()];
        emulate_copy(&g, &mut out, &storage);
        assert_eq!(out, v.to_i64_vec(), "{:?}", v.layout());
    }
}

/// cuBLAS's strided-batched GEMM on host arrays, from its documented column-major
/// semantics: `C_i = op(X_i)·op(Y_i)`, element `(r, c)` of a stored matrix at `r + c·ld`.
fn emulate_gemm(call: &GemmCall, x: &[f64], y: &[f64], c: &mut [f64]) {
    let at = |buf: &[f64], off: usize, ld: usize, t: bool, r: usize, col: usize| {
        if t {
            buf[off + col + r * ld]
        } else {
            buf[off + r + col * ld]
        }
    };
    for i in 0..call.batch {
        for r in 0..call.m {
            for col in 0..call.n {
                let mut acc = 0.0;
                for p in 0..call.k {
                    let u = at(x, call.off1 + i * call.stride1, call.ld1, call.trans1, r, p);
                    let v = at(
                        y,
                        call.off2 + i * call.stride2,
                        call.ld2,
                        call.trans2,
                        p,
                        col,
                    );
                    acc += u * v;
                }
                c[call.off_c + i * call.m * call.n + r + col * call.m] = acc;
            }
        }
    }
}

/// Every element of `t`'s storage, in memory order.
fn storage_f64(t: &crate::Tensor) -> Vec<f64> {
    let len = t.storage().len();
    crate::Tensor::from_parts(t.storage_arc().clone(), Layout::contiguous(&[len])).to_f64_vec()
}

fn geom(t: &crate::Tensor) -> Geom {
    Geom {
        shape: t.shape().to_vec(),
        strides: t.strides().to_vec(),
        offset: t.storage_offset(),
    }
}

#[test]
fn planned_calls_compute_torch_matmul() {
    use crate::Tensor;
    crate::runtime::random::manual_seed(11);
    let base = |shape: &[usize]| Tensor::randn(shape, Some(DType::F64)).unwrap();
    // (a, b) as views: plain, transposed, sliced, broadcast batches, vectors, empty
    let cases: Vec<(Tensor, Tensor)> = vec![
        (base(&[7, 5]), base(&[5, 3])),
        (base(&[5]), base(&[5, 3])),
        (base(&[7, 5]), base(&[5])),
        (base(&[5]), base(&[5])),
        (base(&[2, 1, 7, 5]), base(&[4, 5, 3])),
        (base(&[3, 7, 5]), base(&[5, 9])),
        (base(&[5, 7]).t().unwrap(), base(&[3, 5]).t().unwrap()),
        (
            base(&[7, 10]).slice(1, Some(2), Some(7), 1).unwrap(),
            base(&[6, 5]).narrow(0, 1, 5).unwrap(),
        ),
        (
            base(&[4, 5, 7]).transpose(1, 2).unwrap(),
            base(&[5, 2]).expand(&[3, 4, 5, 2]).unwrap(),
        ),
        (base(&[1, 5]), base(&[5, 1])),
        (base(&[0, 4]), base(&[4, 2])),
        (base(&[3, 0]), base(&[0, 2])),
    ];
    for (a, b) in cases {
        let want = a.matmul(&b).unwrap();
        let (ga, gb) = (geom(&a), geom(&b));
        assert_eq!(readable(&ga, &gb), (true, true), "{:?} {:?}", ga, gb);
        let calls = plan(&ga, &gb).unwrap();
        let x = storage_f64(&b);
        let y = storage_f64(&a);
        let mut c = vec![f64::NAN; want.numel()];
        for call in &calls {
            if call.k == 0 {
                c[call.off_c..call.off_c + call.batch * call.m * call.n].fill(0.0);
            } else {
                emulate_gemm(call, &x, &y, &mut c);
            }
        }
        let w = want.to_f64_vec();
        for (i, (g, w)) in c.iter().zip(&w).enumerate() {
            assert!(
                (g - w).abs() < 1e-12,
                "{:?}@{:?} [{i}]: {g} vs {w}",
                a.shape(),
                b.shape()
            );
        }
    }
}
