//! kiln-macros: `#[kiln::kernel]`, which turns a Rust `fn` written in kiln's tile DSL into a
//! module that builds the kernel's IR with kiln-dsl's `Builder`, and `#[kiln::kernel_fn]`, which
//! turns one into a DSL function that kernels call, inlined into their IR when they are built.
//!
//! Where it sits: the first stage of kiln's pipeline. A kernel's body is never run as Rust: it
//! is parsed with syn (`parse`: syntax -> a small typed model, with every check that needs no
//! specialisation and the span of everything refused) and replayed as builder calls
//! (`generate`: model -> tokens). Shape and dtype checks happen in kiln-dsl when `build` runs
//! at a specialisation, and report the `file:line:col` of the DSL expression at fault.
//!
//! ```text
//! #[kiln::kernel]
//! pub fn add<T, const BLOCK: usize>(x: Ptr<T>, y: Ptr<T>, out: Ptr<T>, n: i32) {
//!     let offs = program_id(0) * BLOCK + arange(0, BLOCK);
//!     let mask = offs < n;
//!     store(out + offs, load(x + offs, mask) + load(y + offs, mask), mask);
//! }
//! // expands to:
//! pub mod add {
//!     pub static SIGNATURE: kiln_dsl::KernelSignature = /* name, file, params, args */;
//!     pub fn build(spec: &kiln_dsl::Spec) -> kiln_dsl::Result<kiln_dsl::Kernel> { /* .. */ }
//!     pub static KERNEL: kiln_dsl::KernelDef = /* SIGNATURE and build, for launchers */;
//!     // Typed: a buffer of the launcher's kind per pointer, the Rust scalar per scalar.
//!     pub fn launch<'a, L: kiln_dsl::Launcher>(
//!         launcher: &L, spec: &kiln_dsl::Spec, grid: kiln_dsl::Grid,
//!         x: &'a L::Buffer, y: &'a L::Buffer, out: &'a L::Buffer, n: i32,
//!     ) -> Result<(), L::Error> { /* .. */ }
//! }
//!
//! #[kiln::kernel_fn]
//! pub fn key_range<const BLOCK_N: usize>(start: i32, seqlen: i32) -> (i32, i32) { ..; (a, b) }
//! // expands to:
//! pub mod key_range {
//!     pub fn call(
//!         __kiln: &mut kiln_dsl::Builder,
//!         __kiln_generics: (kiln_dsl::Value,),   // `BLOCK_N`; a type parameter is a `DType`
//!         __kiln_args: [kiln_dsl::Value; 2],     // `start`, `seqlen`
//!         __kiln_call: kiln_dsl::Loc,            // the call's
//!     ) -> kiln_dsl::Result<(kiln_dsl::Value, kiln_dsl::Value)> { /* .. */ }
//! }
//! ```

mod generate;
mod parse;

use proc_macro::TokenStream;

/// Turns a DSL `fn` into a module with the kernel's `SIGNATURE` and a `build(&Spec)` function.
///
/// Generic parameters are specialisation parameters (type parameters are dtypes, `const`
/// parameters integers or bools); arguments are `Ptr<D>` pointers and `i32`, `i64`, `f32` or
/// type-parameter scalars. `#[kiln::kernel(debug)]` prints the expansion to stderr.
///
/// The body is written in the DSL: `let`/`let mut`, `=` and `op=`, `for i in a..b` and
/// `for i in (a..b).step_by(s)`, `if`/`else if`/`else` (on a constant, only the branch taken is
/// built), arithmetic, comparison and logic operators, `x as D`, literals, float constants such as
/// `f32::NEG_INFINITY`, and these functions and methods (see kiln-dsl's `Builder` for each):
/// `program_id`, `num_programs`, `arange`, `zeros`, `full`, `load`, `store`, `make_block_ptr`,
/// `advance`, `dot`, `trans`, `expand_dims`, `broadcast_to`, `sum`, `max`, `min`, `maximum`,
/// `minimum`, `where_`, `fma`, `exp2`, `exp`, `log2`, `log`, `tanh`, `sqrt`, `rsqrt`, `abs`, `cdiv`,
/// `cast`, `static_assert`; `x.to::<D>()`, `x.trans()`, `x.expand_dims(axis)`,
/// `x.broadcast_to([..])`, `x.sum(axis)`, `x.max(axis)`, `x.min(axis)` and the math functions as
/// methods (`x.exp2()`). Anything else is a compile error that says what to write instead.
///
/// Any other function called is a `#[kernel_fn]` (see [`macro@kernel_fn`]): `f(..);` for one
/// that gives nothing, `f(..)` as an expression for one that gives a value, and
/// `let (a, b) = f(..);` for one that gives a tuple.
///
/// An `if` is also a value wherever an expression can be (a `let` value, an operand, an
/// argument): `let s = if SOFTCAP { cap * tanh(qk / cap) } else { qk * scale };`. Every branch,
/// `else if`s included, ends with its value (an expression without `;`) after any statements, and
/// may assign variables declared before the `if`, as a statement `if`'s branches may. On a
/// constant condition only the branch taken is built and its value is the `if`'s; on a runtime
/// one both are, and they must give one type (a literal such as `0.0` takes the other branch's
/// type, so `if c { tile } else { 0.0 }` works); otherwise building reports both types at the
/// `if`. An `if` without `else`, or a branch without a value, used as a value is a compile error.
#[proc_macro_attribute]
pub fn kernel(attribute: TokenStream, item: TokenStream) -> TokenStream {
    expand(attribute.into(), item.into())
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// Turns a DSL `fn` into a function that kernels and other `#[kernel_fn]`s call: its body is
/// inlined into the caller's IR when the kernel is built, so shared code is written once.
///
/// ```text
/// /// The keys a query block visits, and where its tiles that need no mask end.
/// #[kiln::kernel_fn]
/// pub fn key_range<const BLOCK_M: usize, const BLOCK_N: usize, const CAUSAL: bool>(
///     start_m: i32,
///     shift: i32,
///     seqlen_k: i32,
/// ) -> (i32, i32) {
///     let full_tiles_end = seqlen_k / BLOCK_N * BLOCK_N;
///     let end_n = if CAUSAL { minimum(seqlen_k, (start_m + 1) * BLOCK_M + shift) } else {
///         seqlen_k
///     };
///     (end_n, ..)
/// }
/// // in a kernel:
/// let (end_n, full_end) = key_range::<BLOCK_M, BLOCK_N, CAUSAL>(start_m, shift, seqlen_k);
/// ```
///
/// - **Body**: the DSL of a kernel's, in a scope of its own: it sees its generic parameters,
///   arguments and variables, never its caller's, and cannot assign them (a `mut` argument is its
///   own variable). Loops, `if`s and calls of other functions work as in a kernel; a function may
///   call itself where a constant condition ends it (calls nest at most 64 deep).
/// - **Generic parameters**: type parameters are dtypes, `const` parameters integers or bools, as
///   a kernel's. A call passes every one in a turbofish, in order: a dtype by its name (`f16`) or
///   as the caller's type parameter; a constant as a specialisation parameter, a literal or
///   `{ expr }`. Building refuses a `const` value that is not a constant of its kind.
/// - **Arguments**: any DSL values; what each declares is checked when the call is built: a scalar
///   dtype (`i32`, `f32`, `bool`, `T`..) takes a scalar of that dtype (a literal converts to it),
///   `Ptr<D>` a pointer or tile of pointers to `D`, `BlockPtr<D>` a block pointer to `D`, `Tile` a
///   tile (or scalar) of numbers and `Tile<D>` one of dtype `D`, `_` anything.
/// - **Results**: none (the call is a statement, `f(..);`); `-> T`, the value the body ends with
///   (the call is an expression); or `-> (A, B, ..)`, up to 8, the tuple the body ends with (the
///   call is bound by `let (a, b) = f(..);`, `_` dropping a value). Results are checked as
///   arguments are. A call that takes another number of values than the function gives is a
///   compile error at the call.
/// - **Calls**: a call of any name that is not one of the DSL's functions is a call of a
///   `#[kernel_fn]`, which cannot take such a name. Its path (`f`, `module::f`, `crate::a::f`,
///   `super::f`) is resolved from the module that holds the caller; a path that starts with another
///   crate's name needs a leading `::`. Functions and the kernels that call them are declared at
///   module level, not inside a `fn`'s body (where `super::` cannot name them). Calling
///   something else is Rust's error at the call: it cannot find the name, or `call` in it (a
///   kernel, a Rust `fn`). The number of generic values and arguments is checked by Rust, at the
///   call.
/// - **Errors**: the function's ops keep their own locations, in its body; a semantic error there
///   also says where it was called from, innermost call first:
///   ``... (in `key_range`, called at kernels/src/attention/forward.rs:67:29)``. Arguments and
///   `const` values are refused at the call.
///
/// It expands to a module holding `call(builder, generics, args, loc)` (see the crate docs), which
/// checks the values given and builds the body into the builder's current region.
/// `#[kiln::kernel_fn(debug)]` prints the expansion to stderr.
#[proc_macro_attribute]
pub fn kernel_fn(attribute: TokenStream, item: TokenStream) -> TokenStream {
    let item = proc_macro2::TokenStream::from(item);
    expand_fn(attribute.into(), item.clone())
        .unwrap_or_else(|error| {
            // The function's callers still find a `call`, so that the error is reported once.
            let mut tokens = error.into_compile_error();
            if let Ok(function) = syn::parse2::<syn::ItemFn>(item) {
                tokens.extend(generate::kernel_fn_stub(
                    &function,
                    generate::dsl_crate_path(),
                ));
            }
            tokens
        })
        .into()
}

fn expand(
    attribute: proc_macro2::TokenStream,
    item: proc_macro2::TokenStream,
) -> syn::Result<proc_macro2::TokenStream> {
    let options = parse::parse_options(attribute, parse::Item::Kernel)?;
    let function: syn::ItemFn = syn::parse2(item)?;
    let kernel = parse::parse_kernel(&function)?;
    let tokens = generate::generate_kernel(&kernel, generate::dsl_crate_path());
    if options.debug {
        eprintln!("#[kiln::kernel] expansion of `{}`:\n{tokens}", kernel.name);
    }
    Ok(tokens)
}

fn expand_fn(
    attribute: proc_macro2::TokenStream,
    item: proc_macro2::TokenStream,
) -> syn::Result<proc_macro2::TokenStream> {
    let options = parse::parse_options(attribute, parse::Item::Function)?;
    let function: syn::ItemFn = syn::parse2(item)?;
    let definition = parse::parse_kernel_fn(&function)?;
    let tokens = generate::generate_kernel_fn(&definition, generate::dsl_crate_path());
    if options.debug {
        eprintln!(
            "#[kiln::kernel_fn] expansion of `{}`:\n{tokens}",
            definition.name
        );
    }
    Ok(tokens)
}
