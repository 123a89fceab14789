//! `#[kernel_fn]`s -> tokens: the function's module with its `call`, and the call sites in kernels
//! and functions.
//!
//! ```text
//! #[kiln::kernel_fn]
//! fn key_range<const BLOCK_N: usize>(start: i32, seqlen: i32) -> (i32, i32) { ..; (a, b) }
//! // expands to:
//! mod key_range {
//!     pub fn call(
//!         __kiln: &mut Builder,
//!         __kiln_generics: (Value,),         // `DType` for a type parameter
//!         __kiln_args: [Value; 2],
//!         __kiln_call: Loc,
//!     ) -> Result<(Value, Value)> {
//!         // `const` parameters must be constants, arguments fit their declared types
//!         __kiln.call_fn("key_range", __kiln_call, |__kiln| { /* body */ Ok((a, b)) })
//!     }
//! }
//! // and `let (a, b) = key_range::<BLOCK_N>(start_m, seqlen_k);` in a kernel, to:
//! let (mut a, mut b) = FnResult::<(Value, Value)>::take(
//!     super::key_range::call(__kiln, (BLOCK_N,), [start_m, seqlen_k], loc)?,
//! );
//! ```
//!
//! A call's path is resolved from the module that holds the caller, which is the parent of the
//! generated module the call is in: a relative path gets `super::` in front (`self::` becomes
//! `super::`), `crate::` and `::` paths are kept.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};

use super::Generator;
use super::expressions::Operand;
use crate::parse::model::{FnCall, FnDef, FnResults, FnType, GenericValue, SpecKind};

pub(crate) fn generate_kernel_fn(function: &FnDef, dsl: TokenStream) -> TokenStream {
    let generator = Generator {
        dsl,
        file: quote!(::core::file!()),
    };
    let dsl = &generator.dsl;
    let FnDef {
        name,
        visibility,
        kept_attributes,
        params,
        args,
        body,
        results,
    } = function;
    let name_string = name.to_string();

    let generic_names: Vec<_> = params.iter().map(|param| &param.name).collect();
    let generic_types = params.iter().map(|param| match param.kind {
        SpecKind::DType => quote!(#dsl::DType),
        SpecKind::Int | SpecKind::Bool => quote!(#dsl::Value),
    });
    let const_checks = params.iter().filter_map(|param| {
        let kind = match param.kind {
            SpecKind::DType => return None,
            SpecKind::Int => quote!(#dsl::SpecKind::Int),
            SpecKind::Bool => quote!(#dsl::SpecKind::Bool),
        };
        let param_name = &param.name;
        let param_string = param_name.to_string();
        Some(quote_internal! {
            let #param_name = __kiln.fn_const(
                #param_name,
                #kind,
                #name_string,
                #param_string,
                __kiln_call,
            )?;
            __kiln.name(#param_name, #param_string);
        })
    });
    let arg_count = args.len();
    let arg_names: Vec<_> = args.iter().map(|arg| &arg.name).collect();
    let arg_checks = args.iter().map(|arg| {
        let arg_name = &arg.name;
        let arg_string = arg_name.to_string();
        let what = format!("argument `{arg_name}`");
        let ty = generator.fn_type(&arg.ty);
        quote_internal! {
            let mut #arg_name = __kiln.fn_value(#arg_name, #ty, #what, #name_string, __kiln_call)?;
            __kiln.name(#arg_name, #arg_string);
        }
    });

    let body = generator.block(body);
    let check_result = |ty: &FnType, temporary: &TokenStream, what: &str, span: Span| {
        let ty = generator.fn_type(ty);
        let loc = generator.loc(span);
        quote_internal!(__kiln.fn_value(#temporary, #ty, #what, #name_string, #loc))
    };
    let (result_type, give) = match results {
        FnResults::Nothing => (quote!(()), quote_internal!(::core::result::Result::Ok(()))),
        FnResults::One(ty, value) => {
            let evaluation = generator.expr(value);
            let temporary = quote_internal!(__kiln_result);
            let checked = check_result(ty, &temporary, "the result", value.span);
            let give = quote_internal! {
                let __kiln_result = #evaluation;
                #checked
            };
            (quote!(#dsl::Value), give)
        }
        FnResults::Tuple(values) => {
            let types = values.iter().map(|_| quote!(#dsl::Value));
            let temporaries: Vec<TokenStream> = (0..values.len())
                .map(|index| {
                    let temporary =
                        format_ident!("__kiln_result_{}", index, span = Span::mixed_site());
                    quote!(#temporary)
                })
                .collect();
            let evaluations = values
                .iter()
                .zip(&temporaries)
                .map(|((_, value), temporary)| {
                    let value = generator.expr(value);
                    quote_internal!(let #temporary = #value;)
                });
            let checked = values.iter().zip(&temporaries).enumerate().map(
                |(index, ((ty, value), temporary))| {
                    let what = format!("result {} (of {})", index + 1, values.len());
                    check_result(ty, temporary, &what, value.span)
                },
            );
            let give = quote_internal! {
                #(#evaluations)*
                ::core::result::Result::Ok((#(#checked?),*))
            };
            (quote!((#(#types),*)), give)
        }
    };

    let call_doc = format!(
        " Builds `{name}` into the kernel being built, where it is called at `loc`: `generics` \
         are the values of `<{}>` (a `DType` for a type parameter, a constant `Value` for a \
         `const` one), `args` those of `({})`.",
        generic_names
            .iter()
            .map(|name| name.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        arg_names
            .iter()
            .map(|name| name.to_string())
            .collect::<Vec<_>>()
            .join(", "),
    );
    quote_internal! {
        #(#kept_attributes)*
        #visibility mod #name {
            #[doc = #call_doc]
            #[allow(non_snake_case, unused_mut, unused_variables, unused_assignments)]
            pub fn call(
                __kiln: &mut #dsl::Builder,
                __kiln_generics: (#(#generic_types,)*),
                __kiln_args: [#dsl::Value; #arg_count],
                __kiln_call: #dsl::Loc,
            ) -> #dsl::Result<#result_type> {
                let (#(#generic_names,)*) = __kiln_generics;
                #(#const_checks)*
                let [#(#arg_names),*] = __kiln_args;
                #(#arg_checks)*
                __kiln.call_fn(
                    #name_string,
                    __kiln_call,
                    |__kiln: &mut #dsl::Builder| -> #dsl::Result<#result_type> {
                        #body
                        #give
                    },
                )
            }
        }
    }
}

/// What a `#[kernel_fn]` that did not parse expands to besides its error: a module whose `call`
/// fits any call, so that its callers do not add errors of their own.
pub(crate) fn kernel_fn_stub(function: &syn::ItemFn, dsl: TokenStream) -> TokenStream {
    let (name, visibility) = (&function.sig.ident, &function.vis);
    quote_internal! {
        #visibility mod #name {
            #[doc(hidden)]
            pub fn call<G, const N: usize>(
                _: &mut #dsl::Builder,
                _: G,
                _: [#dsl::Value; N],
                _: #dsl::Loc,
            ) -> #dsl::Result<::core::convert::Infallible> {
                ::core::unreachable!("`#[kernel_fn]` failed to expand")
            }
        }
    }
}

impl Generator {
    /// A call of a `#[kernel_fn]` whose result the call site takes as `taken` (`()`, `Value` or a
    /// tuple of `Value`s): its operands evaluated in order, as a builder call's are, then `call`.
    pub(super) fn fn_call(&self, call: &FnCall, taken: TokenStream) -> TokenStream {
        let dsl = &self.dsl;
        let generic_operands = call.generics.iter().map(|generic| match generic {
            GenericValue::DType(dtype, span) => {
                let dtype = self.dtype_ref(dtype);
                Operand::Tokens(quote_spanned!(*span=> #dtype))
            }
            GenericValue::Const(value) => Operand::Value(value),
        });
        let operands = generic_operands
            .chain(call.args.iter().map(Operand::Value))
            .collect();
        let (evaluations, arguments) = self.operands(operands);
        let (generics, args) = arguments.split_at(call.generics.len());
        let path = self.fn_path(call);
        let loc = self.loc(call.span);
        // The call's tokens take its span, so that Rust's errors about it (arity, what it gives)
        // point at it; the builder stays hygienic.
        let builder = quote_internal!(__kiln);
        let call = quote_spanned! {call.span=>
            #dsl::FnResult::<#taken>::take(
                #path(#builder, (#(#generics,)*), [#(#args),*], #loc)?
            )
        };
        quote_internal!({
            #(#evaluations)*
            #call
        })
    }

    /// The path of the function's `call`, from the generated module the call is in.
    fn fn_path(&self, call: &FnCall) -> TokenStream {
        let path = &call.path;
        let first = &path.segments.first().expect("a path has a segment").ident;
        let last = &path.segments.last().expect("a path has a segment").ident;
        let call_fn = quote_spanned!(last.span()=> call);
        if path.leading_colon.is_some() || first == "crate" || first == "$crate" {
            quote!(#path::#call_fn)
        } else if first == "self" {
            let rest = path.segments.iter().skip(1);
            let parent = quote_spanned!(first.span()=> super);
            quote!(#parent #(::#rest)*::#call_fn)
        } else {
            let parent = quote_spanned!(first.span()=> super);
            quote!(#parent::#path::#call_fn)
        }
    }

    /// A declared argument or result type, as a `kiln_dsl::FnType` (a type parameter is the
    /// `DType` variable bound to it in `call`).
    fn fn_type(&self, ty: &FnType) -> TokenStream {
        let dsl = &self.dsl;
        match ty {
            FnType::Scalar(dtype) => {
                let dtype = self.dtype_ref(dtype);
                quote!(#dsl::FnType::Scalar(#dtype))
            }
            FnType::Ptr(dtype) => {
                let dtype = self.dtype_ref(dtype);
                quote!(#dsl::FnType::Ptr(#dtype))
            }
            FnType::BlockPtr(dtype) => {
                let dtype = self.dtype_ref(dtype);
                quote!(#dsl::FnType::BlockPtr(#dtype))
            }
            FnType::Tile(None) => quote!(#dsl::FnType::Tile(::core::option::Option::None)),
            FnType::Tile(Some(dtype)) => {
                let dtype = self.dtype_ref(dtype);
                quote!(#dsl::FnType::Tile(::core::option::Option::Some(#dtype)))
            }
            FnType::Any => quote!(#dsl::FnType::Any),
        }
    }
}
