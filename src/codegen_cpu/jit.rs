//! A small owner of a Cranelift JIT module for the host CPU.
//!
//! [`Jit`] builds an ISA for the machine it runs on (cranelift-native, with the CPU features it
//! detects: SSE4.1, AVX, FMA, ... on x86-64), compiles functions with `opt_level=speed`, and
//! hands out code pointers.
//!
//! # Safety contract
//! A pointer returned by [`Jit::code_ptr`] points into executable memory owned by the `Jit`.
//! It stays valid exactly as long as that `Jit` value lives: dropping the `Jit` frees the code.
//! Callers turn it into a function pointer with `std::mem::transmute`, which is sound only if
//! the Rust signature matches the Cranelift signature the function was defined with (system-V
//! `extern "C"` on the host) and every pointer argument satisfies what the generated code reads
//! and writes.

use crate::{Error, Result};
use cranelift_codegen::ir::{self, AbiParam, FuncRef, Signature, Type};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, ModuleError, default_libcall_names};
use std::collections::HashSet;

pub(super) fn module_err(e: ModuleError) -> Error {
    Error::Unsupported(format!("cpu codegen: {e}"))
}

/// A function body under construction: the IR builder plus access to the module, so that the
/// body can call imported or previously declared functions.
pub struct FnBody<'a, 'b> {
    /// The Cranelift IR builder of the function being defined.
    pub b: &'a mut FunctionBuilder<'b>,
    module: &'a mut dyn Module,
}

/// Where generated functions go: the JIT's executable memory ([`Jit`]) or an object file
/// (`super::object::ObjectCode`). Kernels are emitted through this, so both hold the same
/// machine code.
pub trait CodeModule {
    /// The ISA the code is compiled for.
    fn isa(&self) -> &dyn cranelift_codegen::isa::TargetIsa;
    /// Declares a function defined outside the module (a helper of the run-time library).
    fn import(&mut self, name: &str, sig: &Signature) -> Result<FuncId>;
    /// Defines function `name` with `linkage`: `body` receives a builder positioned in the
    /// entry block, whose parameters are the signature's, and must fill every block it
    /// creates.
    fn define(
        &mut self,
        name: &str,
        linkage: Linkage,
        sig: &Signature,
        body: &mut dyn FnMut(&mut FnBody) -> Result<()>,
    ) -> Result<FuncId>;

    /// The pointer-sized integer type of the target.
    fn pointer_type(&self) -> Type {
        self.isa().pointer_type()
    }

    /// A signature in the target's C calling convention.
    fn signature(&self, params: &[Type], returns: &[Type]) -> Signature {
        let mut sig = Signature::new(self.isa().default_call_conv());
        sig.params.extend(params.iter().map(|&t| AbiParam::new(t)));
        sig.returns
            .extend(returns.iter().map(|&t| AbiParam::new(t)));
        sig
    }
}

/// Functions Cranelift has compiled in this process (JIT and object files alike).
static COMPILED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many functions Cranelift has compiled in this process: code loaded from the disk
/// cache adds none.
pub fn functions_compiled() -> usize {
    COMPILED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Defines a function in `module` (see [`CodeModule::define`]), reusing the contexts.
pub(super) fn define_function(
    module: &mut dyn Module,
    ctx: &mut cranelift_codegen::Context,
    fctx: &mut FunctionBuilderContext,
    (name, linkage): (&str, Linkage),
    sig: &Signature,
    body: &mut dyn FnMut(&mut FnBody) -> Result<()>,
) -> Result<FuncId> {
    let id = module
        .declare_function(name, linkage, sig)
        .map_err(module_err)?;
    module.clear_context(ctx);
    ctx.func.signature = sig.clone();
    ctx.func.name = ir::UserFuncName::user(0, id.as_u32());
    let config = module.target_config();
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, fctx);
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let mut fb = FnBody {
            b: &mut b,
            module: &mut *module,
        };
        body(&mut fb)?;
        b.seal_all_blocks();
        b.finalize(config);
    }
    let dump = dump_asm();
    ctx.set_disasm(dump);
    // a lowering the ISA's backend lacks panics there (no rule matches): an error naming
    // the function, not the caller's abort
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        module.define_function(id, ctx).map_err(module_err)
    }))
    .unwrap_or_else(|_| {
        Err(Error::Unsupported(format!(
            "cpu codegen: Cranelift's {} backend cannot compile {name}",
            module.isa().name()
        )))
    });
    COMPILED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if dump && let Some(code) = ctx.compiled_code().and_then(|c| c.vcode.as_deref()) {
        eprintln!("; smelt kernel {name}\n{code}");
    }
    module.clear_context(ctx);
    res?;
    Ok(id)
}

/// Cranelift's settings for smelt's code: optimised for speed, position-independent code
/// when it goes into an object file.
pub(super) fn flags(pic: bool) -> Result<settings::Flags> {
    let mut flags = settings::builder();
    let set = |f: &mut settings::Builder, k: &str, v: &str| {
        f.set(k, v)
            .map_err(|e| Error::Unsupported(format!("cpu codegen flag {k}={v}: {e}")))
    };
    set(&mut flags, "opt_level", "speed")?;
    // The JIT places code anywhere in memory: absolute addresses, far calls. An object file
    // is linked into position-independent executables.
    set(&mut flags, "is_pic", if pic { "true" } else { "false" })?;
    set(&mut flags, "use_colocated_libcalls", "false")?;
    Ok(settings::Flags::new(flags))
}

impl FnBody<'_, '_> {
    /// A reference usable with `call` inside this body to the declared function `id`.
    pub fn func_ref(&mut self, id: FuncId) -> FuncRef {
        self.module.declare_func_in_func(id, self.b.func)
    }

    /// The address of data object `id` as a global value usable in this body.
    pub fn data_ref(&mut self, id: cranelift_module::DataId) -> ir::GlobalValue {
        self.module.declare_data_in_func(id, self.b.func)
    }
}

/// A JIT module for the host CPU that owns its compiled code.
pub struct Jit {
    /// `None` only during `drop`.
    module: Option<JITModule>,
    ctx: cranelift_codegen::Context,
    fctx: FunctionBuilderContext,
    /// Defined functions not yet made executable by [`Jit::finalize`].
    pending: HashSet<FuncId>,
    /// Names given to [`Jit::with_symbols`]: the only ones [`Jit::import`] accepts, so that
    /// finalizing never meets an unresolvable symbol.
    symbols: HashSet<String>,
}

impl Jit {
    /// A JIT for the host CPU with no extra symbols.
    pub fn new() -> Result<Jit> {
        Jit::with_symbols(&[])
    }

    /// A JIT for the host CPU that resolves the given names (e.g. libm functions) to addresses.
    pub fn with_symbols(symbols: &[(&str, *const u8)]) -> Result<Jit> {
        let isa = cranelift_native::builder()
            .map_err(|e| Error::Unsupported(format!("cpu codegen: host not supported: {e}")))?
            .finish(flags(false)?)
            .map_err(|e| Error::Unsupported(format!("cpu codegen: {e}")))?;
        let mut builder = JITBuilder::with_isa(isa, default_libcall_names());
        for (name, ptr) in symbols {
            builder.symbol(*name, *ptr);
        }
        let module = JITModule::new(builder);
        let ctx = module.make_context();
        Ok(Jit {
            module: Some(module),
            ctx,
            fctx: FunctionBuilderContext::new(),
            pending: HashSet::new(),
            symbols: symbols.iter().map(|(n, _)| n.to_string()).collect(),
        })
    }

    fn module(&self) -> &JITModule {
        // Invariant: `module` is `Some` outside of `drop`.
        self.module.as_ref().unwrap_or_else(|| unreachable!())
    }

    fn module_mut(&mut self) -> &mut JITModule {
        self.module.as_mut().unwrap_or_else(|| unreachable!())
    }

    /// Makes every defined function executable (resolving imports). Call before `code_ptr`.
    pub fn finalize(&mut self) -> Result<()> {
        self.module_mut()
            .finalize_definitions()
            .map_err(module_err)?;
        self.pending.clear();
        Ok(())
    }

    /// The entry address of a defined and finalized function. See the module's safety contract
    /// for how long it is valid and how to call it.
    pub fn code_ptr(&self, id: FuncId) -> Result<*const u8> {
        if self.pending.contains(&id) {
            return Err(Error::Unsupported(
                "cpu codegen: function used before Jit::finalize".into(),
            ));
        }
        let module = self.module();
        let decl = module.declarations().get_function_decl(id);
        if !decl.linkage.is_definable() {
            return Err(Error::Unsupported(format!(
                "cpu codegen: {:?} is not defined in this module",
                decl.name
            )));
        }
        Ok(module.get_finalized_function(id))
    }
}

/// `SMELT_DUMP_ASM=1` prints the machine code of every compiled function to stderr.
fn dump_asm() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SMELT_DUMP_ASM").is_some_and(|v| v != "0"))
}

impl CodeModule for Jit {
    fn isa(&self) -> &dyn cranelift_codegen::isa::TargetIsa {
        self.module().isa()
    }

    /// `name` must be one of the symbols given to [`Jit::with_symbols`].
    fn import(&mut self, name: &str, sig: &Signature) -> Result<FuncId> {
        if !self.symbols.contains(name) {
            return Err(Error::Unsupported(format!(
                "cpu codegen: symbol {name} was not registered with the JIT"
            )));
        }
        self.module_mut()
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
        let Jit {
            module, ctx, fctx, ..
        } = self;
        let module = module.as_mut().unwrap_or_else(|| unreachable!());
        let id = define_function(module, ctx, fctx, (name, linkage), sig, body)?;
        self.pending.insert(id);
        Ok(id)
    }
}

impl Drop for Jit {
    fn drop(&mut self) {
        if let Some(module) = self.module.take() {
            // SAFETY: code pointers handed out by `code_ptr` are documented to be valid only
            // while this `Jit` lives; it is being dropped, so none may be used any more.
            unsafe { module.free_memory() };
        }
    }
}
