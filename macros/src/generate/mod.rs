//! The model -> tokens: for a kernel, a module holding its `SIGNATURE` and a `build` function
//! that replays the body as kiln-dsl builder calls; for a `#[kernel_fn]`, a module holding a `call`
//! function that replays its body into the caller's builder (`functions`).

/// `quote!` with mixed-site hygiene: the locals the macro introduces (`__kiln`, temporaries) can
/// neither capture nor be captured by the kernel's own names, which keep their spans.
macro_rules! quote_internal {
    ($($tokens:tt)*) => {
        ::quote::quote_spanned!(::proc_macro2::Span::mixed_site() => $($tokens)*)
    };
}

mod crate_path;
mod expressions;
mod functions;
mod statements;

use proc_macro2::{Span, TokenStream};
use quote::quote;

use crate::parse::model::{ArgType, DType, DTypeRef, KernelDef, SpecKind};

pub(crate) use crate_path::dsl_crate_path;
pub(crate) use functions::{generate_kernel_fn, kernel_fn_stub};

/// Generates code that names kiln-dsl's items through `dsl` (see [`dsl_crate_path`]).
struct Generator {
    dsl: TokenStream,
    /// The source file in every `Loc`: `SIGNATURE.file` in a kernel, `file!()` in a function.
    file: TokenStream,
}

pub(crate) fn generate_kernel(kernel: &KernelDef, dsl: TokenStream) -> TokenStream {
    let generator = Generator {
        dsl,
        file: quote!(SIGNATURE.file),
    };
    let dsl = &generator.dsl;
    let KernelDef {
        name,
        visibility,
        kept_attributes,
        params,
        args,
        body,
    } = kernel;
    let name_string = name.to_string();

    let param_entries = params.iter().map(|param| {
        let param_name = param.name.to_string();
        let kind = match param.kind {
            SpecKind::DType => quote!(#dsl::SpecKind::DType),
            SpecKind::Int => quote!(#dsl::SpecKind::Int),
            SpecKind::Bool => quote!(#dsl::SpecKind::Bool),
        };
        quote!(#dsl::SpecParam { name: #param_name, kind: #kind })
    });
    let arg_entries = args.iter().map(|arg| {
        let arg_name = arg.name.to_string();
        let ty = match &arg.ty {
            ArgType::Ptr(dtype) => {
                let dtype = generator.signature_dtype(dtype);
                quote!(#dsl::ArgType::Ptr(#dtype))
            }
            ArgType::Scalar(dtype) => {
                let dtype = generator.signature_dtype(dtype);
                quote!(#dsl::ArgType::Scalar(#dtype))
            }
        };
        quote!(#dsl::ArgDecl { name: #arg_name, ty: #ty })
    });

    let param_bindings = params.iter().map(|param| {
        let param_name = &param.name;
        let param_string = param_name.to_string();
        match param.kind {
            SpecKind::DType => {
                quote_internal!(let #param_name: #dsl::DType = __kiln.spec_dtype(#param_string)?;)
            }
            SpecKind::Int | SpecKind::Bool => {
                let loc = generator.loc(param_name.span());
                quote_internal!(let #param_name = __kiln.spec_const(#param_string, #loc)?;)
            }
        }
    });
    let arg_bindings = args.iter().enumerate().map(|(index, arg)| {
        let arg_name = &arg.name;
        quote_internal!(let mut #arg_name = __kiln.arg(#index);)
    });
    let body = generator.block(body);

    // The typed launcher: buffers of the launcher's kind for pointers, Rust scalars for scalars
    // (a scalar typed by a dtype parameter takes any scalar; the launch checks it).
    let launch_params = args.iter().map(|arg| {
        let arg_name = &arg.name;
        match &arg.ty {
            ArgType::Ptr(_) => quote!(#arg_name: &'a L::Buffer),
            ArgType::Scalar(DTypeRef::Fixed(dtype)) => {
                let rust = match dtype {
                    DType::I64 => quote!(i64),
                    DType::F32 => quote!(f32),
                    _ => quote!(i32),
                };
                quote!(#arg_name: #rust)
            }
            ArgType::Scalar(DTypeRef::Param(_)) => {
                quote!(#arg_name: impl ::core::convert::Into<#dsl::Arg<'a, L::Buffer>>)
            }
        }
    });
    let launch_args = args.iter().map(|arg| {
        let arg_name = &arg.name;
        match &arg.ty {
            ArgType::Ptr(_) => quote!(#dsl::Arg::Buffer(#arg_name)),
            ArgType::Scalar(DTypeRef::Fixed(_)) => {
                quote!(#dsl::Arg::from(#arg_name))
            }
            ArgType::Scalar(DTypeRef::Param(_)) => quote!(#arg_name.into()),
        }
    });
    let launch_doc = format!(
        " Launches `{name}` at `spec` over `grid` with `launcher` (the CPU interpreter, or \
         kiln-runtime's JIT on a GPU); the arguments are the kernel's, typed."
    );

    let build_doc = format!(
        " Builds the kernel `{name}` at `spec`, {}; the IR is checked as it is built.",
        describe_params(kernel)
    );
    quote_internal! {
        #(#kept_attributes)*
        #visibility mod #name {
            /// The kernel's signature, as written.
            pub static SIGNATURE: #dsl::KernelSignature = #dsl::KernelSignature {
                name: #name_string,
                file: ::core::file!(),
                params: &[#(#param_entries),*],
                args: &[#(#arg_entries),*],
            };

            #[doc = #build_doc]
            #[allow(non_snake_case, unused_mut, unused_variables, unused_assignments)]
            pub fn build(spec: &#dsl::Spec) -> #dsl::Result<#dsl::Kernel> {
                let mut __kiln_builder = #dsl::Builder::new(&SIGNATURE, spec)?;
                let __kiln = &mut __kiln_builder;
                #(#param_bindings)*
                #(#arg_bindings)*
                #body
                __kiln_builder.finish()
            }

            /// The kernel as launchers take it.
            pub static KERNEL: #dsl::KernelDef = #dsl::KernelDef {
                signature: &SIGNATURE,
                build,
            };

            #[doc = #launch_doc]
            #[allow(non_snake_case)]
            pub fn launch<'a, L: #dsl::Launcher>(
                launcher: &L,
                spec: &#dsl::Spec,
                grid: #dsl::Grid,
                #(#launch_params),*
            ) -> ::core::result::Result<(), L::Error> {
                launcher.launch(&KERNEL, spec, grid, &[#(#launch_args),*])
            }
        }
    }
}

/// What `spec` must give, for `build`'s doc.
fn describe_params(kernel: &KernelDef) -> String {
    let described: Vec<String> = kernel
        .params
        .iter()
        .map(|param| {
            let kind = match param.kind {
                SpecKind::DType => "a dtype",
                SpecKind::Int => "an integer",
                SpecKind::Bool => "a bool",
            };
            format!("`{}` ({kind})", param.name)
        })
        .collect();
    if described.is_empty() {
        "which is empty (the kernel has no specialisation parameters)".to_string()
    } else {
        format!("which gives {}", described.join(", "))
    }
}

impl Generator {
    /// The `Loc` of the DSL expression at `span`, read from the span while expanding (the file
    /// is the kernel's, in `SIGNATURE`, or the function's).
    fn loc(&self, span: Span) -> TokenStream {
        let (dsl, file) = (&self.dsl, &self.file);
        let span = span.unwrap();
        let (line, column) = (span.line() as u32, span.column() as u32);
        quote!(#dsl::Loc::new(#file, #line, #column))
    }

    /// A dtype in `SIGNATURE`: a type parameter is named, not yet resolved.
    fn signature_dtype(&self, dtype: &DTypeRef) -> TokenStream {
        let dsl = &self.dsl;
        match dtype {
            DTypeRef::Fixed(dtype) => {
                let dtype = self.dtype(*dtype);
                quote!(#dsl::DTypeRef::Fixed(#dtype))
            }
            DTypeRef::Param(name) => {
                let name = name.to_string();
                quote!(#dsl::DTypeRef::Param(#name))
            }
        }
    }

    fn dtype(&self, dtype: DType) -> TokenStream {
        let dsl = &self.dsl;
        match dtype {
            DType::F16 => quote!(#dsl::DType::F16),
            DType::BF16 => quote!(#dsl::DType::BF16),
            DType::F32 => quote!(#dsl::DType::F32),
            DType::I32 => quote!(#dsl::DType::I32),
            DType::I64 => quote!(#dsl::DType::I64),
            DType::Bool => quote!(#dsl::DType::I1),
        }
    }
}
