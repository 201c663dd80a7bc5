//! Random tensors: `rand`, `randn`, `randint` and their `_like` forms, drawn from a global
//! seeded generator (`manual_seed`) or from a `Generator` the caller owns.

use crate::dispatch;
use crate::ir::dtype::{DEFAULT_FLOAT, DType};
use crate::runtime::element::Element;
use crate::runtime::tensor::Tensor;
use crate::{Error, Result, bail};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, StandardNormal};
use std::sync::{LazyLock, Mutex};

/// PyTorch's default seed, so an unseeded program is still deterministic.
const DEFAULT_SEED: u64 = 67280421310721;

/// A seeded source of random numbers. Pass one explicitly (`Tensor::rand_with`) to keep
/// a data loader or test independent of the global generator.
pub struct Generator {
    rng: StdRng,
    seed: u64,
}

impl Generator {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Generator {
        Generator {
            rng: StdRng::seed_from_u64(seed),
            seed,
        }
    }
    /// Restarts the sequence from `seed` (`torch.Generator.manual_seed`).
    pub fn manual_seed(&mut self, seed: u64) -> &mut Generator {
        *self = Generator::new(seed);
        self
    }
    /// The seed this generator was last seeded with.
    pub fn initial_seed(&self) -> u64 {
        self.seed
    }
    /// A fresh seed for a counter-based draw (a dropout mask), advancing the sequence.
    pub fn next_seed(&mut self) -> u64 {
        self.rng.random::<u64>()
    }
}

impl Default for Generator {
    fn default() -> Generator {
        Generator::new(DEFAULT_SEED)
    }
}

static GLOBAL: LazyLock<Mutex<Generator>> = LazyLock::new(|| Mutex::new(Generator::default()));

/// Runs `f` with the global generator locked (a panic elsewhere leaves it usable).
pub fn with_global<R>(f: impl FnOnce(&mut Generator) -> R) -> R {
    let mut g = GLOBAL.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut g)
}

/// Seeds the global generator (`torch.manual_seed`): the same seed gives the same tensors.
pub fn manual_seed(seed: u64) {
    with_global(|g| {
        g.manual_seed(seed);
    });
}

/// The seed of the global generator.
pub fn initial_seed() -> u64 {
    with_global(|g| g.initial_seed())
}

/// Mantissa bits of a float dtype (`std::numeric_limits<T>::digits`).
fn mantissa_digits(dtype: DType) -> u32 {
    match dtype {
        DType::F16 => 11,
        DType::BF16 => 8,
        DType::F32 => 24,
        _ => 53,
    }
}

/// A new contiguous tensor whose i-th element is `f(rng)` converted from f64.
fn fill_f64(
    dtype: DType,
    size: &[usize],
    g: &mut Generator,
    f: impl Fn(&mut StdRng) -> f64,
) -> Result<Tensor> {
    Ok(dispatch!(dtype, T => {
        draw(size, || T::from_f64(f(&mut g.rng)))?
    }))
}

/// A tensor of `size` with one value from `next` per element, allocated up front: a size
/// memory cannot hold is an error before any value is drawn.
fn draw<T: Element>(size: &[usize], mut next: impl FnMut() -> T) -> Result<Tensor> {
    Tensor::filled(size, |s: &mut [T]| s.iter_mut().for_each(|x| *x = next()))
}

fn require_float(name: &str, dtype: DType) -> Result<()> {
    if !dtype.is_float() {
        bail!(
            DType,
            "\"{name}\" not implemented for '{}'",
            dtype.scalar_name()
        );
    }
    Ok(())
}

/// Checks `randint`'s range as PyTorch's `random_` does.
fn check_int_range(low: i64, high: i64, dtype: DType) -> Result<()> {
    if low >= high {
        bail!(
            Value,
            "random_ expects 'from' to be less than 'to', but got from={low} >= to={high}"
        );
    }
    let (min, max) = match dtype {
        DType::Bool => (0.0, 1.0),
        DType::U8 => (0.0, u8::MAX as f64),
        DType::I8 => (i8::MIN as f64, i8::MAX as f64),
        DType::I16 => (i16::MIN as f64, i16::MAX as f64),
        DType::I32 => (i32::MIN as f64, i32::MAX as f64),
        DType::I64 => (i64::MIN as f64, i64::MAX as f64),
        DType::F16 => (-65504.0, 65504.0),
        DType::BF16 => (-bf16_max(), bf16_max()),
        DType::F32 => (f32::MIN as f64, f32::MAX as f64),
        DType::F64 => (f64::MIN, f64::MAX),
    };
    for (v, name) in [(low, "from"), (high - 1, "to - 1")] {
        if (v as f64) < min || (v as f64) > max {
            return Err(Error::Value(format!(
                "{name} is out of bounds for {}",
                dtype.scalar_name()
            )));
        }
    }
    Ok(())
}

fn bf16_max() -> f64 {
    half::bf16::MAX.to_f64()
}

impl Tensor {
    /// Seeds the global generator (`torch.manual_seed`).
    pub fn manual_seed(seed: u64) {
        manual_seed(seed)
    }

    /// Uniform samples in [0, 1) (`torch.rand`); f32 unless a float dtype is given.
    pub fn rand(size: &[usize], dtype: Option<DType>) -> Result<Tensor> {
        with_global(|g| Tensor::rand_with(size, dtype, g))
    }

    /// `rand` drawing from `g`. Each value is a random multiple of 2^-digits of the dtype,
    /// so it is exact in that dtype and never rounds up to 1.
    pub fn rand_with(size: &[usize], dtype: Option<DType>, g: &mut Generator) -> Result<Tensor> {
        let dtype = dtype.unwrap_or(DEFAULT_FLOAT);
        require_float("check_uniform_bounds", dtype)?;
        let digits = mantissa_digits(dtype);
        let scale = (-(digits as f64)).exp2();
        fill_f64(dtype, size, g, |r| {
            (r.random::<u64>() >> (64 - digits)) as f64 * scale
        })
    }

    /// Standard normal samples (`torch.randn`); f32 unless a float dtype is given.
    pub fn randn(size: &[usize], dtype: Option<DType>) -> Result<Tensor> {
        with_global(|g| Tensor::randn_with(size, dtype, g))
    }

    /// `randn` drawing from `g`; sampled in f64 and rounded once to the dtype.
    pub fn randn_with(size: &[usize], dtype: Option<DType>, g: &mut Generator) -> Result<Tensor> {
        let dtype = dtype.unwrap_or(DEFAULT_FLOAT);
        require_float("normal_kernel_cpu", dtype)?;
        fill_f64(dtype, size, g, |r| StandardNormal.sample(r))
    }

    /// Integers uniform in [low, high) (`torch.randint`); i64 unless a dtype is given.
    pub fn randint(low: i64, high: i64, size: &[usize], dtype: Option<DType>) -> Result<Tensor> {
        with_global(|g| Tensor::randint_with(low, high, size, dtype, g))
    }

    /// `randint` drawing from `g`.
    pub fn randint_with(
        low: i64,
        high: i64,
        size: &[usize],
        dtype: Option<DType>,
        g: &mut Generator,
    ) -> Result<Tensor> {
        let dtype = dtype.unwrap_or(DType::I64);
        check_int_range(low, high, dtype)?;
        Ok(dispatch!(dtype, T => {
            draw(size, || T::from_i64(g.rng.random_range(low..high)))?
        }))
    }

    /// `rand` with this tensor's shape and dtype.
    pub fn rand_like(&self) -> Result<Tensor> {
        Tensor::rand(self.shape(), Some(self.dtype()))
    }

    /// `randn` with this tensor's shape and dtype.
    pub fn randn_like(&self) -> Result<Tensor> {
        Tensor::randn(self.shape(), Some(self.dtype()))
    }

    /// `randint` with this tensor's shape and dtype.
    pub fn randint_like(&self, low: i64, high: i64) -> Result<Tensor> {
        Tensor::randint(low, high, self.shape(), Some(self.dtype()))
    }
}
