//! ONNX element types smelt has no dtype for, each held exactly in one it has: uint16 in i32,
//! uint32 and uint64 in i64, int4 and int2 in i8, uint4 and uint2 in u8, the float8 formats,
//! float8e8m0 and float4 (e2m1) in f32. Their bytes decode to that dtype, a `Cast` to them rounds or
//! wraps as ONNX defines it, and an output of such a type is written back in it where `.npy`
//! has one (the unsigned types; the others as int8/uint8 and float32, as bf16 is).
//!
//! Arithmetic on a held unsigned type runs in the wider dtype: exact while results stay in
//! range, and an output is reduced modulo 2^bits, so sums, differences and products that
//! overflowed still end as the ONNX type's wrapped value. uint64 values must be below 2^63.

use super::proto::data_type;
use crate::{DType, Result, bail};

/// An ONNX element type held in a wider smelt dtype.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Held {
    /// uint16, uint32 or uint64 (`bits`).
    Unsigned(u32),
    /// int4, int2 (`signed`), uint4, uint2: packed several to a byte in files.
    Narrow { bits: u32, signed: bool },
    /// A float8 or float4 format.
    Float(Minifloat),
    /// float8e8m0 (the scales of the MX formats): pattern `b` is `2^(b-127)`, `0xFF` is NaN;
    /// no sign, no zero.
    Scale,
}

/// The value of float8e8m0 pattern `b`.
pub fn scale_value(b: u8) -> f64 {
    if b == 0xFF {
        f64::NAN
    } else {
        2f64.powi(i32::from(b) - 127)
    }
}

/// A small binary float format: `mantissa` stored bits, the smallest normal exponent
/// `emin`, the largest finite value `max`, and which specials it has.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Minifloat {
    /// Bits in a stored value.
    pub bits: u32,
    /// Stored mantissa bits.
    pub mantissa: u32,
    /// The exponent of the smallest normal value.
    pub emin: i32,
    /// The largest finite value.
    pub max: f64,
    /// Has infinities (e5m2).
    pub inf: bool,
    /// Has NaN.
    pub nan: bool,
    /// Has a negative zero (the `fnuz` formats do not).
    pub neg_zero: bool,
}

impl Minifloat {
    /// The exponent bias.
    fn bias(&self) -> i32 {
        1 - self.emin
    }

    /// The value of the stored pattern `b` (the low `bits` bits).
    pub fn decode(&self, b: u8) -> f64 {
        let b = u32::from(b) & ((1 << self.bits) - 1);
        let sign_bit = 1 << (self.bits - 1);
        let e_bits = self.bits - 1 - self.mantissa;
        let exp = (b >> self.mantissa) & ((1 << e_bits) - 1);
        let man = b & ((1 << self.mantissa) - 1);
        let neg = b & sign_bit != 0;
        if self.nan && !self.neg_zero && b == sign_bit {
            return f64::NAN; // fnuz: the pattern of -0 is NaN
        }
        let top = (1 << e_bits) - 1;
        if self.inf && exp == top {
            // IEEE-like (e5m2): all-ones exponent is inf or NaN
            return if man == 0 {
                if neg {
                    f64::NEG_INFINITY
                } else {
                    f64::INFINITY
                }
            } else {
                f64::NAN
            };
        }
        if self.nan && self.neg_zero && !self.inf && exp == top && man == (1 << self.mantissa) - 1 {
            return f64::NAN; // fn (e4m3fn): only all-ones is NaN
        }
        let m = f64::from(man) / f64::from(1u32 << self.mantissa);
        let v = if exp == 0 {
            m * 2f64.powi(self.emin)
        } else {
            (1.0 + m) * 2f64.powi(exp as i32 - self.bias())
        };
        if neg { -v } else { v }
    }

    /// The exponent of the largest binade.
    pub fn emax(&self) -> i32 {
        self.max.log2().floor() as i32
    }
}

const fn minifloat(
    bits: u32,
    mantissa: u32,
    emin: i32,
    max: f64,
    specials: (bool, bool, bool),
) -> Held {
    Held::Float(Minifloat {
        bits,
        mantissa,
        emin,
        max,
        inf: specials.0,
        nan: specials.1,
        neg_zero: specials.2,
    })
}

/// The held type of an ONNX element type code, `None` for those smelt has (or lacks
/// entirely).
pub fn held(elem_type: i32) -> Option<Held> {
    const FLOAT8E4M3FN: i32 = 17;
    const FLOAT8E4M3FNUZ: i32 = 18;
    const FLOAT8E5M2: i32 = 19;
    const FLOAT8E5M2FNUZ: i32 = 20;
    const UINT4: i32 = 21;
    const INT4: i32 = 22;
    const FLOAT4E2M1: i32 = 23;
    const FLOAT8E8M0: i32 = 24;
    const UINT2: i32 = 25;
    const INT2: i32 = 26;
    Some(match elem_type {
        data_type::UINT16 => Held::Unsigned(16),
        data_type::UINT32 => Held::Unsigned(32),
        data_type::UINT64 => Held::Unsigned(64),
        UINT4 => Held::Narrow {
            bits: 4,
            signed: false,
        },
        INT4 => Held::Narrow {
            bits: 4,
            signed: true,
        },
        UINT2 => Held::Narrow {
            bits: 2,
            signed: false,
        },
        INT2 => Held::Narrow {
            bits: 2,
            signed: true,
        },
        FLOAT8E4M3FN => minifloat(8, 3, -6, 448.0, (false, true, true)),
        FLOAT8E4M3FNUZ => minifloat(8, 3, -7, 240.0, (false, true, false)),
        FLOAT8E5M2 => minifloat(8, 2, -14, 57344.0, (true, true, true)),
        FLOAT8E5M2FNUZ => minifloat(8, 2, -15, 57344.0, (false, true, false)),
        FLOAT4E2M1 => minifloat(4, 1, 0, 6.0, (false, false, true)),
        FLOAT8E8M0 => Held::Scale,
        _ => return None,
    })
}

impl Held {
    /// The smelt dtype that holds the values.
    pub fn dtype(self) -> DType {
        match self {
            Held::Unsigned(16) => DType::I32,
            Held::Unsigned(_) => DType::I64,
            Held::Narrow { signed: true, .. } => DType::I8,
            Held::Narrow { signed: false, .. } => DType::U8,
            Held::Float(_) | Held::Scale => DType::F32,
        }
    }

    /// Bits of one element in a file's `raw_data`.
    pub fn file_bits(self) -> u32 {
        match self {
            Held::Unsigned(b) | Held::Narrow { bits: b, .. } => b,
            Held::Float(f) => f.bits,
            Held::Scale => 8,
        }
    }

    /// The smallest and largest integer of a held integer type.
    pub fn int_range(self) -> Option<(i64, i64)> {
        match self {
            Held::Unsigned(64) => Some((0, i64::MAX)),
            Held::Unsigned(b) => Some((0, (1i64 << b) - 1)),
            Held::Narrow { bits, signed: true } => {
                Some((-(1i64 << (bits - 1)), (1i64 << (bits - 1)) - 1))
            }
            Held::Narrow {
                bits,
                signed: false,
            } => Some((0, (1i64 << bits) - 1)),
            Held::Float(_) | Held::Scale => None,
        }
    }
}

/// The elements of `raw` (packed `file_bits` each, little-endian) as f64 or i64 values.
pub enum Decoded {
    Ints(Vec<i64>),
    Floats(Vec<f64>),
}

/// Decodes `n` elements of held type `h` from raw bytes, refusing a length that does not
/// match.
pub fn decode_raw(h: Held, raw: &[u8], n: usize, what: &str) -> Result<Decoded> {
    let bits = h.file_bits() as usize;
    let want = (n * bits).div_ceil(8);
    if raw.len() != want {
        bail!(
            Value,
            "{what}: raw_data holds {} bytes, but {n} elements of {bits} bits need {want}",
            raw.len()
        );
    }
    Ok(match h {
        Held::Unsigned(b) => {
            let size = b as usize / 8;
            let v = raw
                .chunks_exact(size)
                .map(|c| {
                    let mut a = [0u8; 8];
                    a[..size].copy_from_slice(c);
                    u64::from_le_bytes(a)
                })
                .collect();
            Decoded::Ints(unsigned_values(v, what)?)
        }
        Held::Narrow { bits, signed } => {
            let per = 8 / bits as usize;
            let v = (0..n)
                .map(|i| {
                    let field = (raw[i / per] >> ((i % per) * bits as usize)) & ((1 << bits) - 1);
                    extend(i64::from(field), bits, signed)
                })
                .collect();
            Decoded::Ints(v)
        }
        Held::Float(f) => {
            let per = 8 / f.bits as usize;
            let v = (0..n)
                .map(|i| {
                    let field = raw[i / per] >> ((i % per) * f.bits as usize);
                    f.decode(field)
                })
                .collect();
            Decoded::Floats(v)
        }
        Held::Scale => Decoded::Floats(raw.iter().map(|&b| scale_value(b)).collect()),
    })
}

/// Decodes `n` elements of held type `h` from a typed field: `int32_data` (one packed byte
/// per entry for the sub-byte types) or `uint64_data` (uint32, uint64).
pub fn decode_typed(
    h: Held,
    int32: &[i32],
    uint64: &[u64],
    n: usize,
    what: &str,
) -> Result<Decoded> {
    match h {
        Held::Unsigned(16) => {
            check_count(int32.len(), n, "int32_data", what)?;
            Ok(Decoded::Ints(
                int32.iter().map(|&x| i64::from(x as u16)).collect(),
            ))
        }
        Held::Unsigned(_) => {
            check_count(uint64.len(), n, "uint64_data", what)?;
            Ok(Decoded::Ints(unsigned_values(uint64.to_vec(), what)?))
        }
        _ => {
            let bytes: Vec<u8> = int32.iter().map(|&x| x as u8).collect();
            decode_raw(h, &bytes, n, what)
        }
    }
}

fn check_count(len: usize, n: usize, field: &str, what: &str) -> Result<()> {
    if len != n {
        bail!(
            Value,
            "{what}: {field} holds {len} elements, but the shape holds {n}"
        );
    }
    Ok(())
}

/// Unsigned values as i64, refusing those at or above 2^63.
fn unsigned_values(v: Vec<u64>, what: &str) -> Result<Vec<i64>> {
    v.into_iter()
        .enumerate()
        .map(|(i, x)| {
            i64::try_from(x).map_err(|_| {
                crate::Error::Value(format!(
                    "{what}: uint64 value {x} at flat index {i} is 2^63 or more (smelt holds \
                     uint64 in i64)"
                ))
            })
        })
        .collect()
}

/// The low `bits` bits of `x` read as a signed or unsigned integer.
fn extend(x: i64, bits: u32, signed: bool) -> i64 {
    if signed && x >= 1 << (bits - 1) {
        x - (1 << bits)
    } else {
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format(code: i32) -> Minifloat {
        match held(code) {
            Some(Held::Float(f)) => f,
            other => panic!("{code} is {other:?}"),
        }
    }

    #[test]
    fn float8_patterns_decode_to_the_published_values() {
        // e4m3fn: 0x7E is 448, 0x7F NaN, 0x01 the smallest subnormal 2^-9, 0x80 is -0
        let f = format(17);
        assert_eq!(f.decode(0x7E), 448.0);
        assert!(f.decode(0x7F).is_nan());
        assert_eq!(f.decode(0x01), 2f64.powi(-9));
        assert_eq!(f.decode(0x38), 1.0);
        assert!(f.decode(0x80).is_sign_negative() && f.decode(0x80) == 0.0);
        // e4m3fnuz: 0x7F is 240, 0x80 NaN, bias 8
        let f = format(18);
        assert_eq!(f.decode(0x7F), 240.0);
        assert!(f.decode(0x80).is_nan());
        assert_eq!(f.decode(0x40), 1.0);
        // e5m2: 0x7B is 57344, 0x7C inf, 0x7D NaN
        let f = format(19);
        assert_eq!(f.decode(0x7B), 57344.0);
        assert_eq!(f.decode(0x7C), f64::INFINITY);
        assert_eq!(f.decode(0xFC), f64::NEG_INFINITY);
        assert!(f.decode(0x7D).is_nan());
        assert_eq!(f.decode(0x01), 2f64.powi(-16));
        // e5m2fnuz: 0x7F is 57344, 0x80 NaN, smallest subnormal 2^-17
        let f = format(20);
        assert_eq!(f.decode(0x7F), 57344.0);
        assert!(f.decode(0x80).is_nan());
        assert_eq!(f.decode(0x01), 2f64.powi(-17));
        // e2m1: 0x7 is 6, 0x1 is 0.5, 0xF is -6
        let f = format(23);
        assert_eq!(f.decode(0x7), 6.0);
        assert_eq!(f.decode(0x1), 0.5);
        assert_eq!(f.decode(0xF), -6.0);
        assert_eq!(f.emax(), 2);
    }

    #[test]
    fn packed_elements_decode_low_bits_first() {
        let int4 = held(22).unwrap();
        let Decoded::Ints(v) = decode_raw(int4, &[0x8F, 0x07], 3, "t").unwrap() else {
            panic!("int4 decodes to integers")
        };
        assert_eq!(v, [-1, -8, 7]);
        let uint2 = held(25).unwrap();
        let Decoded::Ints(v) = decode_raw(uint2, &[0b1110_0100], 4, "t").unwrap() else {
            panic!("uint2 decodes to integers")
        };
        assert_eq!(v, [0, 1, 2, 3]);
        assert!(decode_raw(int4, &[0, 0], 5, "t").is_err());
        let u64t = held(13).unwrap();
        assert!(decode_raw(u64t, &u64::MAX.to_le_bytes(), 1, "t").is_err());
    }
}
