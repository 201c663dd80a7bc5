//! `matmul` and `linear`. Float products run on the `gemm` crate, which takes every operand
//! through row and column strides, so transposed and sliced views are multiplied in place;
//! broadcast batch dims get batch stride 0. bf16 multiplies in f32 and rounds once; integer
//! dtypes use a plain wrapping i64 loop.

use crate::ir::dtype::DType;
use crate::ir::op::{Op, TensorType};
use crate::ir::shape::{broadcast_shapes, contiguous_strides, numel};
use crate::runtime::access;
use crate::runtime::element::Element;
use crate::runtime::kernels::copy::{cast_new, copy_into};
use crate::runtime::strided::{SendPtr, Walk};
use crate::runtime::tensor::Tensor;
use crate::{Result, bail, dispatch};
use half::f16;

use smelt_rt::gemm::PAR_FLOPS;

/// One operand seen as a batch of matrices.
struct Operand {
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
    /// Strides of the batch dims, broadcast to the output's batch shape.
    batch: Vec<usize>,
}

/// The geometry of a (batched) product `[batch] m×k · k×n`.
struct Plan {
    batch: Vec<usize>,
    a: Operand,
    b: Operand,
}

/// `x` as matrices; a 1-D operand becomes a row (`as_row`) or a column.
fn operand(x: &Tensor, as_row: bool) -> (Vec<usize>, Vec<usize>, Operand) {
    let (sh, st) = (x.shape(), x.strides());
    if sh.len() == 1 {
        let (rows, cols, rs, cs) = if as_row {
            (1, sh[0], 0, st[0])
        } else {
            (sh[0], 1, st[0], 0)
        };
        return (
            vec![],
            vec![],
            Operand {
                rows,
                cols,
                rs,
                cs,
                batch: vec![],
            },
        );
    }
    let r = sh.len() - 2;
    let op = Operand {
        rows: sh[r],
        cols: sh[r + 1],
        rs: st[r],
        cs: st[r + 1],
        batch: vec![],
    };
    (sh[..r].to_vec(), st[..r].to_vec(), op)
}

/// Strides of batch dims `sh`/`st` read as the broadcast batch shape `to` (0 where broadcast).
fn batch_strides(sh: &[usize], st: &[usize], to: &[usize]) -> Vec<usize> {
    let lead = to.len() - sh.len();
    (0..to.len())
        .map(|i| {
            if i < lead || sh[i - lead] != to[i] {
                0
            } else {
                st[i - lead]
            }
        })
        .collect()
}

fn plan(a: &Tensor, b: &Tensor) -> Result<Plan> {
    let (ash, ast, mut pa) = operand(a, true);
    let (bsh, bst, mut pb) = operand(b, false);
    let batch = broadcast_shapes(&ash, &bsh)?;
    pa.batch = batch_strides(&ash, &ast, &batch);
    pb.batch = batch_strides(&bsh, &bst, &batch);
    if pa.cols != pb.rows {
        bail!(
            Shape,
            "matmul: inner sizes {} and {} differ",
            pa.cols,
            pb.rows
        );
    }
    Ok(Plan {
        batch,
        a: pa,
        b: pb,
    })
}

/// Element offsets `(out, a, b)` of each matrix of the batch.
fn batch_offsets(p: &Plan, m: usize, n: usize) -> Vec<[usize; 3]> {
    let mut full = p.batch.clone();
    full.extend([m, n]);
    let out_st = contiguous_strides(&full);
    let nb = p.batch.len();
    let walk = Walk::new(&p.batch, [&out_st[..nb], &p.a.batch, &p.b.batch]);
    let mut v = Vec::with_capacity(walk.numel());
    walk.run_range(0, walk.numel(), &mut |[o, a, b], len, [so, sa, sb]| {
        v.extend((0..len).map(|i| [o + i * so, a + i * sa, b + i * sb]));
    });
    v
}

/// Entry point for `matmul` and `linear`; `out` is the type the shape rule inferred.
pub fn eval(op: &Op, inputs: &[&Tensor], out: &TensorType) -> Result<Tensor> {
    match op {
        Op::Matmul => product(inputs[0], inputs[1], None, out),
        Op::Linear { has_bias } => {
            let w = inputs[1];
            // wᵀ as a view: the product reads w through swapped strides.
            let wt = if w.dim() == 2 {
                w.with_layout(w.layout().transpose(0, 1))
            } else {
                w.clone()
            };
            product(inputs[0], &wt, has_bias.then(|| inputs[2]), out)
        }
        _ => bail!(Unsupported, "{} is not a matrix product", op.name()),
    }
}

/// `a · b (+ bias)` into a new tensor of type `ty`.
fn product(a: &Tensor, b: &Tensor, bias: Option<&Tensor>, ty: &TensorType) -> Result<Tensor> {
    if ty.dtype == DType::BF16 {
        let f = |t: &Tensor| cast_new(t, DType::F32);
        let ty32 = TensorType::new(DType::F32, ty.shape.clone());
        let bias32 = bias.map(f).transpose()?;
        let r = product(&f(a)?, &f(b)?, bias32.as_ref(), &ty32)?;
        return cast_new(&r, DType::BF16);
    }
    let p = plan(a, b)?;
    let out = Tensor::alloc(ty.dtype, &ty.shape)?;
    if let Some(bias) = bias {
        copy_into(&out, bias);
    }
    let (m, k, n) = (p.a.rows, p.a.cols, p.b.cols);
    if out.numel() == 0 || k == 0 {
        return Ok(out);
    }
    let offs = batch_offsets(&p, m, n);
    let acc = access::lock(&[a, b], &[&out]);
    let ptrs = (acc.read::<u8>(0), acc.read::<u8>(1), acc.write::<u8>(0));
    let accumulate = bias.is_some();
    // SAFETY: offsets and strides come from the operands' layouts (in bounds); each batch
    // writes its own m×n block of the fresh output.
    unsafe {
        match ty.dtype {
            DType::F16 => gemm_batches::<f16>(&p, &offs, ptrs, accumulate),
            DType::F32 => gemm_batches::<f32>(&p, &offs, ptrs, accumulate),
            DType::F64 => gemm_batches::<f64>(&p, &offs, ptrs, accumulate),
            d if d.is_bool() => bail!(DType, "\"addmm_impl_cpu_\" not implemented for 'Bool'"),
            d => dispatch!(d, T => int_batches::<T>(&p, &offs, ptrs)),
        }
    }
    drop(acc);
    Ok(out)
}

/// Runs one gemm per batch matrix; parallel inside large products, across small ones.
///
/// # Safety
/// `offs` and the plan's strides must address the buffers behind `ptrs` in bounds.
unsafe fn gemm_batches<T: smelt_rt::gemm::GemmElem>(
    p: &Plan,
    offs: &[[usize; 3]],
    (pa, pb, po): (*const u8, *const u8, *mut u8),
    accumulate: bool,
) {
    let product = smelt_rt::gemm::Product {
        m: p.a.rows,
        n: p.b.cols,
        k: p.a.cols,
        a: (p.a.rs as isize, p.a.cs as isize),
        b: (p.b.rs as isize, p.b.cs as isize),
    };
    let ptrs = (pa as *const T, pb as *const T, po as *mut T);
    let beta = accumulate.then_some(T::ONE);
    let threads = crate::runtime::threads::available();
    // SAFETY: as the caller promises.
    unsafe { smelt_rt::gemm::batches(&product, ptrs, offs, beta, threads) }
}

/// Integer product: wrapping i64 sums added to the (zero or bias) output.
///
/// # Safety
/// As for `gemm_batches`.
unsafe fn int_batches<T: Element>(
    p: &Plan,
    offs: &[[usize; 3]],
    (pa, pb, po): (*const u8, *const u8, *mut u8),
) {
    let (m, k, n) = (p.a.rows, p.a.cols, p.b.cols);
    let (pa, pb, po) = (
        SendPtr(pa as *mut T),
        SendPtr(pb as *mut T),
        SendPtr(po as *mut T),
    );
    let rows = offs.len() * m;
    let row = |r: usize| unsafe {
        let [o, a, b] = offs[r / m];
        let i = r % m;
        for j in 0..n {
            let mut s = 0i64;
            for l in 0..k {
                let x = *pa.get().add(a + i * p.a.rs + l * p.a.cs);
                let y = *pb.get().add(b + l * p.b.rs + j * p.b.cs);
                s = s.wrapping_add(x.to_i64().wrapping_mul(y.to_i64()));
            }
            let d = po.get().add(o + i * n + j);
            *d = T::from_i64((*d).to_i64().wrapping_add(s));
        }
    };
    if numel(&[rows, n, k]) >= PAR_FLOPS {
        crate::runtime::threads::par_for(rows, &row);
    } else {
        (0..rows).for_each(row);
    }
}
