//! syn -> the kernel model: the signature, then the body statement by statement, with every
//! check the macro can make and the span of everything it refuses.

pub(crate) mod model;

mod expressions;
mod functions;
mod scope;
mod signature;
mod statements;

use proc_macro2::TokenStream;
use syn::ItemFn;

use model::{KernelDef, SpecKind};
use scope::{BindingKind, Scopes};

/// The options of `#[kiln::kernel(..)]`.
pub(crate) struct Options {
    /// `#[kiln::kernel(debug)]`: print the expansion to stderr at compile time.
    pub(crate) debug: bool,
}

pub(crate) fn parse_options(attribute: TokenStream) -> syn::Result<Options> {
    let mut options = Options { debug: false };
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("debug") {
            options.debug = true;
            Ok(())
        } else {
            Err(meta.error("unknown option; `#[kiln::kernel]` takes only `debug`"))
        }
    });
    syn::parse::Parser::parse2(parser, attribute)?;
    Ok(options)
}

pub(crate) fn parse_kernel(function: &ItemFn) -> syn::Result<KernelDef> {
    let mut kept_attributes = Vec::new();
    for attribute in &function.attrs {
        if attribute.path().is_ident("doc") || attribute.path().is_ident("cfg") {
            kept_attributes.push(attribute.clone());
        } else {
            return Err(syn::Error::new_spanned(
                attribute,
                "a kernel keeps only doc comments and `#[cfg]` attributes; remove this one",
            ));
        }
    }
    signature::check_header(&function.sig)?;
    let params = signature::parse_params(&function.sig.generics)?;
    let args = signature::parse_args(&function.sig, &params)?;

    let mut scopes = Scopes::new();
    let names = params
        .iter()
        .map(|param| &param.name)
        .chain(args.iter().map(|arg| &arg.name));
    for (index, name) in names.clone().enumerate() {
        if names.clone().take(index).any(|earlier| earlier == name) {
            return Err(syn::Error::new_spanned(
                name,
                format!("`{name}` is declared twice in this kernel's signature"),
            ));
        }
    }
    for param in &params {
        let kind = match param.kind {
            SpecKind::DType => BindingKind::DTypeParam,
            SpecKind::Int | SpecKind::Bool => BindingKind::ConstParam,
        };
        scopes.bind(&param.name, kind);
    }
    for arg in &args {
        let kind = BindingKind::Argument {
            mutable: arg.mutable,
        };
        scopes.bind(&arg.name, kind);
    }
    let body = BodyParser { scopes }.parse_block(&function.block)?;

    Ok(KernelDef {
        name: function.sig.ident.clone(),
        visibility: function.vis.clone(),
        kept_attributes,
        params,
        args,
        body,
    })
}

/// Parses a kernel body into DSL statements, resolving every name it meets.
struct BodyParser {
    scopes: Scopes,
}
