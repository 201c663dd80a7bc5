//! Strided copies, optionally through an index tensor: the data-movement library ops of
//! compiled models. `cat` and `stack` are one copy per operand into a slice of the result,
//! `repeat` one copy from a view whose repeated dims have stride 0, `flip` one copy from a
//! view with negative strides, and `embedding`, `index_select` and `gather` one indexed
//! copy each. A copy moves element bits and computes nothing, so the result is the eager
//! kernel's, bit for bit. [`scatter`] runs the index on the destination instead, writing or
//! combining (a sum, product, largest or smallest, with the eager kernels' arithmetic:
//! floats in f64 rounded to their type, NaN winning a comparison, integers wrapping in
//! i64, bools as 0 and 1) in the walk's row-major order: `scatter`, `scatter_add`,
//! `index_add` and `scatter_reduce`.

use crate::ElemType;

/// The most dims a copy walks.
pub const MAX_RANK: usize = 16;

/// The index of an indexed copy: element `p` of the walk reads the source at
/// `src(p) + step · index[index_at(p)]`, where the index value must lie in `0..size`.
#[derive(Clone, Copy, Debug)]
pub struct Index<'a> {
    /// Element 0 of the index view.
    pub ptr: *const u8,
    /// Whether the index holds `i64` (else `i32`).
    pub wide: bool,
    /// The index view's strides over the walk, in elements.
    pub strides: &'a [isize],
    /// The number of valid index values (the indexed dim's size).
    pub size: usize,
    /// Source elements per index unit (the indexed dim's stride).
    pub step: isize,
}

/// One copy: `dst[p] = src[p]` (or through [`Index`]) for every point `p` of `shape`.
#[derive(Clone, Copy, Debug)]
pub struct Copy<'a> {
    /// Bytes per element.
    pub size: usize,
    /// The walk's sizes.
    pub shape: &'a [usize],
    /// The destination's strides, in elements.
    pub dst: &'a [isize],
    /// The source's strides, in elements.
    pub src: &'a [isize],
    /// The index, for an indexed copy.
    pub index: Option<Index<'a>>,
}

/// How a scatter combines a value with the element it lands on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Combine {
    /// `dst + src`.
    Sum,
    /// `dst · src`.
    Prod,
    /// The larger (NaN if either is).
    Amax,
    /// The smaller (NaN if either is).
    Amin,
}

impl Combine {
    /// Every combination, in the order of their codes.
    pub const ALL: [Combine; 4] = [Combine::Sum, Combine::Prod, Combine::Amax, Combine::Amin];

    /// The combination's code in a plan.
    pub fn code(self) -> u64 {
        self as u64
    }
}

/// An index value outside `0..size`, with the value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfRange(pub i64);

/// Runs copy `c` from element 0 of `src` to element 0 of `dst`. Stops at the first index
/// outside its range, having written the elements before it.
///
/// # Safety
/// Every element the walk reaches is inside the memory behind `dst` (writable) and `src`
/// (readable) for every index value in range, and the index view's elements are readable.
/// `dst` does not overlap what `src` reads. The ranks agree and are at most [`MAX_RANK`].
pub unsafe fn run(c: &Copy, dst: *mut u8, src: *const u8) -> Result<(), OutOfRange> {
    // SAFETY: the caller's contract.
    unsafe { walk(c, Target::Source, dst, src) }
}

/// Runs copy `c` with its index on the destination: point `p` of the walk writes (or, with
/// `add`, the elements' type, adds into, as the eager kernels add) `dst(p) + step · index[index_at(p)]`, in the walk's row-major order, so
/// the last of duplicate positions wins a plain scatter. Stops at the first index outside
/// its range, having written the elements before it.
///
/// # Safety
/// As [`run`], the index now choosing destination elements; `c` has an index.
pub unsafe fn scatter(
    c: &Copy,
    add: Option<(Combine, ElemType)>,
    dst: *mut u8,
    src: *const u8,
) -> Result<(), OutOfRange> {
    // SAFETY: the caller's contract.
    unsafe { walk(c, Target::Destination(add), dst, src) }
}

/// Which side a copy's index moves, and whether a scatter adds.
#[derive(Clone, Copy)]
enum Target {
    Source,
    Destination(Option<(Combine, ElemType)>),
}

/// [`run`] and [`scatter`].
///
/// # Safety
/// As theirs.
unsafe fn walk(c: &Copy, target: Target, dst: *mut u8, src: *const u8) -> Result<(), OutOfRange> {
    let rank = c.shape.len();
    if c.shape.contains(&0) {
        return Ok(());
    }
    let (len, inner) = match rank {
        0 => (1, [0isize; 3]),
        _ => {
            let d = rank - 1;
            let i = c.index.map_or(0, |x| x.strides[d]);
            (c.shape[d], [c.dst[d], c.src[d], i])
        }
    };
    // a run whose elements are adjacent on both sides and read one index value: one memcpy
    let add = match target {
        Target::Destination(add) => add,
        Target::Source => None,
    };
    let on_dst = matches!(target, Target::Destination(_));
    let whole = inner[0] == 1 && inner[1] == 1 && inner[2] == 0 && add.is_none();
    let outer = rank.saturating_sub(1);
    let mut at = [0usize; MAX_RANK];
    let (mut od, mut os, mut oi) = (0isize, 0isize, 0isize);
    // an index that varies along the run is read per element, one that does not per run
    let per_element = c.index.filter(|_| inner[2] != 0);
    loop {
        let base = match (&c.index, per_element) {
            // SAFETY: the index element at offset `oi` is inside the index view (contract).
            (Some(ix), None) => unsafe { lookup(ix, oi) }?,
            _ => 0,
        };
        let (bd, bs) = if on_dst { (base, 0) } else { (0, base) };
        let d = dst.wrapping_offset((od + bd) * c.size as isize);
        let s = src.wrapping_offset((os + bs) * c.size as isize);
        if whole {
            // SAFETY: a run of `len` adjacent elements on both sides, inside both (contract).
            unsafe { std::ptr::copy_nonoverlapping(s, d, len * c.size) };
        } else {
            for k in 0..len as isize {
                let picked = match &per_element {
                    // SAFETY: as above, for point `k` of the run.
                    Some(ix) => unsafe { lookup(ix, oi + k * inner[2]) }?,
                    None => 0,
                };
                let (pd, ps) = if on_dst { (picked, 0) } else { (0, picked) };
                let from = s.wrapping_offset((k * inner[1] + ps) * c.size as isize);
                let to = d.wrapping_offset((k * inner[0] + pd) * c.size as isize);
                // SAFETY: point `k` of the run is inside both sides (contract).
                unsafe {
                    match add {
                        Some((how, a)) => combine(how, a, from, to),
                        None => element(from, to, c.size),
                    }
                };
            }
        }
        // the next run: an odometer over the outer dims
        let mut dim = outer;
        loop {
            if dim == 0 {
                return Ok(());
            }
            dim -= 1;
            at[dim] += 1;
            let i = c.index.map_or(0, |x| x.strides[dim]);
            if at[dim] < c.shape[dim] {
                od += c.dst[dim];
                os += c.src[dim];
                oi += i;
                break;
            }
            let back = (c.shape[dim] - 1) as isize;
            od -= back * c.dst[dim];
            os -= back * c.src[dim];
            oi -= back * i;
            at[dim] = 0;
        }
    }
}

/// The source offset index element `at` selects, checked against the range.
///
/// # Safety
/// The index element at offset `at` is readable.
unsafe fn lookup(ix: &Index, at: isize) -> Result<isize, OutOfRange> {
    // SAFETY: the caller's contract.
    let v = unsafe {
        if ix.wide {
            (ix.ptr as *const i64).offset(at).read_unaligned()
        } else {
            i64::from((ix.ptr as *const i32).offset(at).read_unaligned())
        }
    };
    if v < 0 || v as u64 >= ix.size as u64 {
        return Err(OutOfRange(v));
    }
    Ok(v as isize * ix.step)
}

/// `*dst = *dst ∘ *src` for elements of `a`'s type, `∘` as `how` says and as the eager
/// kernels compute it.
///
/// # Safety
/// Both pointers address an element of `a`'s type.
unsafe fn combine(how: Combine, a: ElemType, src: *const u8, dst: *mut u8) {
    use half::{bf16, f16};
    let float = |x: f64, y: f64| match how {
        Combine::Sum => x + y,
        Combine::Prod => x * y,
        _ if x.is_nan() || y.is_nan() => f64::NAN,
        // ties keep the element already there (-0.0 against 0.0), as the eager kernel
        Combine::Amax => {
            if x >= y {
                x
            } else {
                y
            }
        }
        Combine::Amin => {
            if x <= y {
                x
            } else {
                y
            }
        }
    };
    let int = |x: i64, y: i64| match how {
        Combine::Sum => x.wrapping_add(y),
        Combine::Prod => x.wrapping_mul(y),
        Combine::Amax => x.max(y),
        Combine::Amin => x.min(y),
    };
    macro_rules! float {
        ($t:ty, $to:expr, $from:expr) => {{
            let (x, y) = (
                (dst as *mut $t).read_unaligned(),
                (src as *const $t).read_unaligned(),
            );
            (dst as *mut $t).write_unaligned($from(float($to(x), $to(y))))
        }};
    }
    macro_rules! int {
        ($t:ty) => {{
            let (x, y) = (
                (dst as *mut $t).read_unaligned(),
                (src as *const $t).read_unaligned(),
            );
            (dst as *mut $t).write_unaligned(int(x as i64, y as i64) as $t)
        }};
    }
    // SAFETY: the caller's contract; unaligned, as in `element`.
    unsafe {
        match a {
            ElemType::F16 => float!(f16, f16::to_f64, crate::scalar::f16_from_f64),
            ElemType::BF16 => float!(bf16, bf16::to_f64, crate::scalar::bf16_from_f64),
            ElemType::F32 => float!(f32, f64::from, |v: f64| v as f32),
            ElemType::F64 => float!(f64, |v: f64| v, |v: f64| v),
            ElemType::U8 => int!(u8),
            ElemType::I8 => int!(i8),
            ElemType::I16 => int!(i16),
            ElemType::I32 => int!(i32),
            ElemType::I64 => int!(i64),
            ElemType::Bool => {
                let v = int(i64::from(dst.read() != 0), i64::from(src.read() != 0));
                dst.write(u8::from(v != 0))
            }
        }
    }
}

/// Copies one element of `size` bytes.
///
/// # Safety
/// Both pointers address `size` valid bytes.
unsafe fn element(src: *const u8, dst: *mut u8, size: usize) {
    // SAFETY: the caller's contract; unaligned accesses, as buffers of mixed dtypes share
    // the scratch only at aligned offsets but a view's offset may be anything.
    unsafe {
        match size {
            1 => dst.write(src.read()),
            2 => (dst as *mut u16).write_unaligned((src as *const u16).read_unaligned()),
            4 => (dst as *mut u32).write_unaligned((src as *const u32).read_unaligned()),
            8 => (dst as *mut u64).write_unaligned((src as *const u64).read_unaligned()),
            _ => std::ptr::copy_nonoverlapping(src, dst, size),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The copy written as nested loops over a 2-D walk, for comparison.
    fn naive(shape: [usize; 2], dst: [isize; 2], src: [isize; 2], base: isize) -> Vec<u32> {
        let mut out = vec![0u32; 64];
        for i in 0..shape[0] {
            for j in 0..shape[1] {
                let s = base + i as isize * src[0] + j as isize * src[1];
                let d = i as isize * dst[0] + j as isize * dst[1];
                out[d as usize] = s as u32;
            }
        }
        out
    }

    #[test]
    fn strided_copies_match_nested_loops() {
        // element i holds i, so the naive copy writes offsets
        let data: Vec<u32> = (0..64).collect();
        for (shape, dst, src) in [
            ([3, 4], [4, 1], [8, 1]),  // rows of a wider array
            ([3, 4], [1, 3], [4, 1]),  // a transpose
            ([2, 5], [5, 1], [0, 1]),  // a broadcast row
            ([4, 3], [3, 1], [-3, 1]), // flipped rows (from the last)
        ] {
            let mut out = vec![0u32; 64];
            let base = if src[0] < 0 { 9 } else { 0 };
            let from = data.as_ptr().wrapping_add(base);
            let c = Copy {
                size: 4,
                shape: &shape,
                dst: &dst,
                src: &src,
                index: None,
            };
            // SAFETY: every offset of these walks is inside the 64-element arrays.
            unsafe {
                run(&c, out.as_mut_ptr().cast(), from.cast()).unwrap();
            }
            assert_eq!(
                out,
                naive(shape, dst, src, base as isize),
                "{shape:?} {src:?}"
            );
        }
    }

    #[test]
    fn indexed_copies_pick_rows_and_refuse_bad_indices() {
        // embedding: rows 2, 0, 2 of a [3, 4] table
        let table: Vec<f32> = (0..12).map(|x| x as f32).collect();
        let ids: Vec<i64> = vec![2, 0, 2];
        let mut out = vec![0f32; 12];
        let ix = Index {
            ptr: ids.as_ptr().cast(),
            wide: true,
            strides: &[1, 0],
            size: 3,
            step: 4,
        };
        let c = Copy {
            size: 4,
            shape: &[3, 4],
            dst: &[4, 1],
            src: &[0, 1],
            index: Some(ix),
        };
        // SAFETY: indices in 0..3 reach rows of the table; the output has 12 elements.
        unsafe { run(&c, out.as_mut_ptr().cast(), table.as_ptr().cast()).unwrap() };
        let want: Vec<f32> = [8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11]
            .map(|x| x as f32)
            .to_vec();
        assert_eq!(out, want);
        // gather along the last dim: the index varies inside the run
        let idx: Vec<i32> = vec![3, 0, 1, 1];
        let g = Copy {
            size: 4,
            shape: &[2, 2],
            dst: &[2, 1],
            src: &[4, 0],
            index: Some(Index {
                ptr: idx.as_ptr().cast(),
                wide: false,
                strides: &[2, 1],
                size: 4,
                step: 1,
            }),
        };
        let mut out = vec![0f32; 4];
        // SAFETY: rows 0 and 1 of the table, columns in 0..4.
        unsafe { run(&g, out.as_mut_ptr().cast(), table.as_ptr().cast()).unwrap() };
        assert_eq!(out, vec![3.0, 0.0, 5.0, 5.0]);
        for bad in [3i64, -1] {
            let ids = [0i64, bad];
            let ix = Index {
                ptr: ids.as_ptr().cast(),
                ..ix
            };
            let c = Copy {
                shape: &[2, 4],
                index: Some(ix),
                ..c
            };
            let mut out = vec![0f32; 8];
            // SAFETY: row 0 of the table fills 4 of the 8 elements; the bad index is refused
            // before any read through it.
            let r = unsafe { run(&c, out.as_mut_ptr().cast(), table.as_ptr().cast()) };
            assert_eq!(r, Err(OutOfRange(bad)));
        }
    }
}
