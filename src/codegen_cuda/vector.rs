//! Vector accesses of pointwise kernels: each thread takes four consecutive elements, and an
//! access that walks the space in row-major order moves them with one aligned vector load or
//! store (16 bytes for 4-byte elements) instead of four scalar ones.
//!
//! Each element type has a CUDA vector type of four lanes (two for 8-byte elements, so that
//! no access is wider than 16 bytes). Half types travel as their bits (`ushort4`) and bools
//! as bytes, converted at the lane.

use crate::ir::dtype::DType;

/// How four lanes of one dtype move: `count` vectors of `ctype`, `per` lanes each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VecType {
    pub dtype: DType,
    pub ctype: &'static str,
    pub count: usize,
    per: usize,
}

/// Lanes each thread of a vector loop handles.
pub const LANES: usize = 4;

const COMPONENTS: [&str; 4] = ["x", "y", "z", "w"];

impl VecType {
    /// The vector form of `d`'s elements.
    pub fn of(d: DType) -> Self {
        let (ctype, count) = match d {
            DType::F32 => ("float4", 1),
            DType::I32 => ("int4", 1),
            DType::F64 => ("double2", 2),
            DType::I64 => ("longlong2", 2),
            DType::I16 => ("short4", 1),
            DType::F16 | DType::BF16 => ("ushort4", 1),
            DType::I8 => ("char4", 1),
            DType::U8 | DType::Bool => ("uchar4", 1),
        };
        VecType {
            dtype: d,
            ctype,
            count,
            per: LANES / count,
        }
    }

    /// Bytes one vector moves: the alignment its address needs.
    pub fn align(&self) -> usize {
        LANES * self.dtype.size() / self.count
    }

    /// The component of variable `name` (vectors `name0`, `name1`, ...) holding `lane`.
    pub fn component(&self, name: &str, lane: usize) -> String {
        if self.count == 1 {
            format!("{name}.{}", COMPONENTS[lane])
        } else {
            format!("{name}{}.{}", lane / self.per, COMPONENTS[lane % self.per])
        }
    }

    /// The names of the vectors of variable `name`.
    pub fn parts(&self, name: &str) -> Vec<String> {
        if self.count == 1 {
            vec![name.to_string()]
        } else {
            (0..self.count).map(|v| format!("{name}{v}")).collect()
        }
    }

    /// Statements loading the vectors of `name` from element `addr` of `ptr`.
    pub fn load(&self, name: &str, ptr: &str, addr: &str) -> Vec<String> {
        self.each(name, ptr, addr, |t, p, at| {
            format!("const {t} {p} = *reinterpret_cast<const {t}*>({at});")
        })
    }

    /// Statements storing the vectors of `name` to element `addr` of `ptr`.
    pub fn store(&self, name: &str, ptr: &str, addr: &str) -> Vec<String> {
        self.each(name, ptr, addr, |t, p, at| {
            format!("*reinterpret_cast<{t}*>({at}) = {p};")
        })
    }

    /// One statement per vector: `f(ctype, vector variable, its address)`.
    fn each(
        &self,
        name: &str,
        ptr: &str,
        addr: &str,
        f: impl Fn(&str, &str, &str) -> String,
    ) -> Vec<String> {
        self.parts(name)
            .iter()
            .enumerate()
            .map(|(v, p)| f(self.ctype, p, &format!("{ptr} + {}", self.at(addr, v))))
            .collect()
    }

    fn at(&self, addr: &str, v: usize) -> String {
        if v == 0 {
            format!("({addr})")
        } else {
            format!("({addr} + {})", v * self.per)
        }
    }

    /// A lane component as a stored element of `dtype` (what `scalar::load` converts).
    pub fn lane_in(&self, comp: &str) -> String {
        match self.dtype {
            DType::F16 => format!("__half2float(__ushort_as_half({comp}))"),
            DType::BF16 => format!("__bfloat162float(__ushort_as_bfloat16({comp}))"),
            DType::Bool => format!("({comp} != 0)"),
            _ => comp.to_string(),
        }
    }

    /// A computed value `e` as a lane component (its storage form: bits for halves).
    pub fn lane_out(&self, e: &str) -> String {
        match self.dtype {
            DType::F16 => format!("__half_as_ushort(__float2half_rn({e}))"),
            DType::BF16 => format!("__bfloat16_as_ushort(__float2bfloat16_rn({e}))"),
            DType::Bool => format!("(unsigned char)({e})"),
            _ => e.to_string(),
        }
    }
}
