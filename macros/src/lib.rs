//! kiln-macros: `#[kiln::kernel]`, which turns a Rust `fn` written in kiln's tile DSL into a
//! module that builds the kernel's IR with kiln-dsl's `Builder`.
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
/// `minimum`, `where_`, `exp2`, `exp`, `log2`, `log`, `tanh`, `sqrt`, `rsqrt`, `abs`, `cdiv`,
/// `cast`, `static_assert`; `x.to::<D>()`, `x.trans()`, `x.expand_dims(axis)`,
/// `x.broadcast_to([..])`, `x.sum(axis)`, `x.max(axis)`, `x.min(axis)` and the math functions as
/// methods (`x.exp2()`). Anything else is a compile error that says what to write instead.
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

fn expand(
    attribute: proc_macro2::TokenStream,
    item: proc_macro2::TokenStream,
) -> syn::Result<proc_macro2::TokenStream> {
    let options = parse::parse_options(attribute)?;
    let function: syn::ItemFn = syn::parse2(item)?;
    let kernel = parse::parse_kernel(&function)?;
    let tokens = generate::generate_kernel(&kernel, generate::dsl_crate_path());
    if options.debug {
        eprintln!("#[kiln::kernel] expansion of `{}`:\n{tokens}", kernel.name);
    }
    Ok(tokens)
}
