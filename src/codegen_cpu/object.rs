//! Code generation into a relocatable object file instead of executable memory: the same
//! kernels as the JIT (`lower::define_kernel`), for ahead-of-time compiled models.
//!
//! The object is position-independent (it links into PIE executables); helpers are
//! imported by name and resolved by the run-time library (`libsmelt_rt.a`) at link time.

use super::jit::{CodeModule, FnBody, define_function, flags, module_err};
use crate::{Error, Result};
use cranelift_codegen::ir::Signature;
use cranelift_codegen::isa::TargetIsa;
use cranelift_codegen::settings::Configurable;
use cranelift_frontend::FunctionBuilderContext;
use cranelift_module::{DataDescription, DataId, FuncId, Linkage, Module, default_libcall_names};
use cranelift_object::{ObjectBuilder, ObjectModule};
use std::sync::Arc;

/// The CPU an object is compiled for: the compiling machine, an x86-64 level, or 64-bit
/// Arm (cross-compiled).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CpuTarget {
    /// Every extension of the compiling machine.
    #[default]
    Native,
    /// x86-64-v3: AVX2, FMA, BMI1/2 (Haswell and later, Zen).
    X86_64V3,
    /// x86-64-v4: x86-64-v3 and AVX-512 F/VL/DQ.
    X86_64V4,
    /// AArch64 (ARMv8-A and later, whose NEON holds the kernels' 128-bit vectors) on Linux:
    /// `aarch64-unknown-linux-gnu`.
    Aarch64,
}

/// The target triples [`CpuTarget::from_triple`] takes.
pub const TRIPLES: [&str; 2] = ["x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu"];

impl CpuTarget {
    /// Parses `native`, `x86-64-v3`, `x86-64-v4` or `aarch64`.
    pub fn parse(s: &str) -> Result<CpuTarget> {
        match s {
            "native" => Ok(CpuTarget::Native),
            "x86-64-v3" => Ok(CpuTarget::X86_64V3),
            "x86-64-v4" => Ok(CpuTarget::X86_64V4),
            "aarch64" => Ok(CpuTarget::Aarch64),
            _ => Err(Error::Value(format!(
                "unknown CPU target '{s}' (expected native, x86-64-v3, x86-64-v4 or aarch64)"
            ))),
        }
    }

    /// The target for target triple `triple` and CPU `cpu` (a name `parse` reads): on
    /// x86-64 the CPU picks the level; AArch64 has one target, so `cpu` must be `native`
    /// (the default) or `aarch64`.
    pub fn from_triple(triple: &str, cpu: &str) -> Result<CpuTarget> {
        let c = CpuTarget::parse(cpu)?;
        match (triple, c) {
            ("x86_64-unknown-linux-gnu", CpuTarget::Aarch64) => Err(Error::Value(
                "the CPU aarch64 is not an x86-64 CPU (expected native, x86-64-v3 or x86-64-v4)"
                    .into(),
            )),
            ("x86_64-unknown-linux-gnu", CpuTarget::Native) if !cfg!(target_arch = "x86_64") => {
                Err(Error::Value(
                    "this machine is not x86-64: name the CPU (x86-64-v3 or x86-64-v4)".into(),
                ))
            }
            ("x86_64-unknown-linux-gnu", c) => Ok(c),
            ("aarch64-unknown-linux-gnu", CpuTarget::Native | CpuTarget::Aarch64) => {
                Ok(CpuTarget::Aarch64)
            }
            ("aarch64-unknown-linux-gnu", c) => Err(Error::Value(format!(
                "the CPU {} is for x86-64, not the target aarch64-unknown-linux-gnu (leave it out)",
                c.name()
            ))),
            _ => Err(Error::Value(format!(
                "unknown target triple '{triple}' (expected one of: {})",
                TRIPLES.join(", ")
            ))),
        }
    }

    /// The name `parse` reads.
    pub fn name(self) -> &'static str {
        match self {
            CpuTarget::Native => "native",
            CpuTarget::X86_64V3 => "x86-64-v3",
            CpuTarget::X86_64V4 => "x86-64-v4",
            CpuTarget::Aarch64 => "aarch64",
        }
    }

    /// The target triple of the code: the compiling machine's for `Native`.
    pub fn triple(self) -> &'static str {
        match self {
            CpuTarget::Aarch64 => "aarch64-unknown-linux-gnu",
            CpuTarget::Native if cfg!(target_arch = "aarch64") => "aarch64-unknown-linux-gnu",
            _ => "x86_64-unknown-linux-gnu",
        }
    }

    /// Whether code for this target runs on the compiling machine's architecture (a
    /// cross-compiled object needs another machine, or an emulator, to run).
    pub fn is_host(self) -> bool {
        self.triple() == CpuTarget::Native.triple()
    }

    /// Cranelift's ISA for this target.
    pub fn isa(self, pic: bool) -> Result<Arc<dyn TargetIsa>> {
        let err = |e: &dyn std::fmt::Display| Error::Unsupported(format!("cpu codegen: {e}"));
        let mut b = match self {
            CpuTarget::Native => cranelift_native::builder().map_err(|e| err(&e))?,
            // the baseline of the architecture (NEON is part of ARMv8-A), or of x86-64
            // with the level's extensions added below
            _ => cranelift_codegen::isa::lookup_by_name(self.triple()).map_err(|e| err(&e))?,
        };
        let v3 = [
            "has_sse3",
            "has_ssse3",
            "has_sse41",
            "has_sse42",
            "has_popcnt",
            "has_avx",
            "has_avx2",
            "has_fma",
            "has_bmi1",
            "has_bmi2",
            "has_lzcnt",
        ];
        let v4 = ["has_avx512f", "has_avx512vl", "has_avx512dq"];
        let extra: Vec<&str> = match self {
            CpuTarget::Native | CpuTarget::Aarch64 => Vec::new(),
            CpuTarget::X86_64V3 => v3.to_vec(),
            CpuTarget::X86_64V4 => [&v3[..], &v4[..]].concat(),
        };
        for f in extra {
            b.enable(f).map_err(|e| err(&e))?;
        }
        b.finish(flags(pic)?).map_err(|e| err(&e))
    }
}

/// The bits of `smelt_rt::model::FEATURES` that code compiled for `isa` needs.
pub fn feature_mask(isa: &dyn TargetIsa) -> u64 {
    let on: Vec<String> = isa
        .isa_flags()
        .iter()
        .filter(|v| v.as_bool() == Some(true))
        .map(|v| v.name.to_string())
        .collect();
    smelt_rt::model::FEATURES
        .iter()
        .enumerate()
        .filter(|(_, (cl, _))| on.iter().any(|n| n == cl))
        .fold(0, |m, (i, _)| m | 1 << i)
}

/// An object file under construction.
pub struct ObjectCode {
    module: ObjectModule,
    ctx: cranelift_codegen::Context,
    fctx: FunctionBuilderContext,
}

impl ObjectCode {
    /// An empty object named `name` for `target`.
    pub fn new(name: &str, target: CpuTarget) -> Result<ObjectCode> {
        let builder = ObjectBuilder::new(target.isa(true)?, name, default_libcall_names())
            .map_err(module_err)?;
        let module = ObjectModule::new(builder);
        let ctx = module.make_context();
        Ok(ObjectCode {
            module,
            ctx,
            fctx: FunctionBuilderContext::new(),
        })
    }

    /// Defines data object `name` holding `bytes` (aligned to `align`), with `relocs`: at
    /// each byte offset, the address of a function or of another data object.
    pub fn data(
        &mut self,
        (name, linkage): (&str, Linkage),
        bytes: Vec<u8>,
        align: u64,
        relocs: &[(u32, Target)],
    ) -> Result<DataId> {
        self.define_data((name, linkage), bytes, align, relocs, false)
    }

    /// Defines data object `name` of `bytes` that the code may write (a counter).
    pub fn writable_data(&mut self, name: &str, bytes: Vec<u8>, align: u64) -> Result<DataId> {
        self.define_data((name, Linkage::Local), bytes, align, &[], true)
    }

    fn define_data(
        &mut self,
        (name, linkage): (&str, Linkage),
        bytes: Vec<u8>,
        align: u64,
        relocs: &[(u32, Target)],
        writable: bool,
    ) -> Result<DataId> {
        let id = self
            .module
            .declare_data(name, linkage, writable, false)
            .map_err(module_err)?;
        let mut d = DataDescription::new();
        // an empty object still gets an address
        let bytes = if bytes.is_empty() { vec![0; 8] } else { bytes };
        d.define(bytes.into_boxed_slice());
        d.set_align(align);
        for &(at, target) in relocs {
            match target {
                Target::Func(f) => {
                    let r = self.module.declare_func_in_data(f, &mut d);
                    d.write_function_addr(at, r);
                }
                Target::Data(x) => {
                    let r = self.module.declare_data_in_data(x, &mut d);
                    d.write_data_addr(at, r, 0);
                }
            }
        }
        self.module.define_data(id, &d).map_err(module_err)?;
        Ok(id)
    }

    /// The object file's bytes.
    pub fn finish(self) -> Result<Vec<u8>> {
        self.module
            .finish()
            .emit()
            .map_err(|e| Error::Unsupported(format!("cpu codegen: writing the object: {e}")))
    }
}

/// What a data relocation points at.
#[derive(Clone, Copy, Debug)]
pub enum Target {
    /// A function of the object.
    Func(FuncId),
    /// A data object of the object.
    Data(DataId),
}

impl CodeModule for ObjectCode {
    fn isa(&self) -> &dyn TargetIsa {
        self.module.isa()
    }

    fn import(&mut self, name: &str, sig: &Signature) -> Result<FuncId> {
        self.module
            .declare_function(name, Linkage::Import, sig)
            .map_err(module_err)
    }

    fn define(
        &mut self,
        name: &str,
        linkage: Linkage,
        sig: &Signature,
        body: &mut dyn FnMut(&mut FnBody) -> Result<()>,
    ) -> Result<FuncId> {
        define_function(
            &mut self.module,
            &mut self.ctx,
            &mut self.fctx,
            (name, linkage),
            sig,
            body,
        )
    }
}
