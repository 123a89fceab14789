//! syn -> the model of a kernel or `#[kernel_fn]`: the signature, then the body statement by
//! statement, with every check the macro can make and the span of everything it refuses.

pub(crate) mod model;

mod expressions;
mod functions;
mod scope;
mod signature;
mod statements;

use proc_macro2::TokenStream;
use syn::ItemFn;

use syn::{Attribute, Ident};

use model::{FnDef, KernelDef, SpecKind, SpecParamDef};
use scope::{BindingKind, Scopes};

/// What is being parsed: a kernel, or a `#[kernel_fn]` (whose body is the same DSL).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Item {
    Kernel,
    Function,
}

impl Item {
    /// The attribute, for messages.
    pub(crate) fn attribute(self) -> &'static str {
        match self {
            Item::Kernel => "#[kiln::kernel]",
            Item::Function => "#[kiln::kernel_fn]",
        }
    }

    /// `a kernel`, for messages.
    pub(crate) fn noun(self) -> &'static str {
        match self {
            Item::Kernel => "a kernel",
            Item::Function => "a `#[kernel_fn]`",
        }
    }
}

/// The options of `#[kiln::kernel(..)]` and `#[kiln::kernel_fn(..)]`.
pub(crate) struct Options {
    /// `(debug)`: print the expansion to stderr at compile time.
    pub(crate) debug: bool,
}

pub(crate) fn parse_options(attribute: TokenStream, item: Item) -> syn::Result<Options> {
    let mut options = Options { debug: false };
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("debug") {
            options.debug = true;
            Ok(())
        } else {
            Err(meta.error(format!(
                "unknown option; `{}` takes only `debug`",
                item.attribute()
            )))
        }
    });
    syn::parse::Parser::parse2(parser, attribute)?;
    Ok(options)
}

pub(crate) fn parse_kernel(function: &ItemFn) -> syn::Result<KernelDef> {
    let kept_attributes = kept_attributes(&function.attrs, Item::Kernel)?;
    signature::check_header(&function.sig, Item::Kernel)?;
    let params = signature::parse_params(&function.sig.generics, Item::Kernel)?;
    let args = signature::parse_args(&function.sig, &params)?;
    let arg_bindings = args.iter().map(|arg| (&arg.name, arg.mutable));
    let scopes = signature_scope(&params, arg_bindings, Item::Kernel)?;
    let mut parser = BodyParser {
        scopes,
        item: Item::Kernel,
    };
    let body = parser.parse_block(&function.block)?;

    Ok(KernelDef {
        name: function.sig.ident.clone(),
        visibility: function.vis.clone(),
        kept_attributes,
        params,
        args,
        body,
    })
}

pub(crate) fn parse_kernel_fn(function: &ItemFn) -> syn::Result<FnDef> {
    let kept_attributes = kept_attributes(&function.attrs, Item::Function)?;
    let name = &function.sig.ident;
    if functions::is_builtin(&name.to_string()) {
        return Err(syn::Error::new_spanned(
            name,
            format!("`{name}` is a function of the DSL; give this `#[kernel_fn]` another name"),
        ));
    }
    signature::check_header(&function.sig, Item::Function)?;
    let params = signature::parse_params(&function.sig.generics, Item::Function)?;
    let args = signature::parse_fn_args(&function.sig, &params)?;
    let returns = signature::parse_fn_return(&function.sig.output, &params)?;
    let arg_bindings = args.iter().map(|arg| (&arg.name, arg.mutable));
    let scopes = signature_scope(&params, arg_bindings, Item::Function)?;
    let mut parser = BodyParser {
        scopes,
        item: Item::Function,
    };
    let (body, results) = parser.parse_fn_body(function, returns)?;

    Ok(FnDef {
        name: name.clone(),
        visibility: function.vis.clone(),
        kept_attributes,
        params,
        args,
        body,
        results,
    })
}

/// Doc comments and `#[cfg]`s, which the generated module keeps; anything else is refused.
fn kept_attributes(attributes: &[Attribute], item: Item) -> syn::Result<Vec<Attribute>> {
    attributes
        .iter()
        .map(|attribute| {
            if attribute.path().is_ident("doc") || attribute.path().is_ident("cfg") {
                Ok(attribute.clone())
            } else {
                Err(syn::Error::new_spanned(
                    attribute,
                    format!(
                        "{} keeps only doc comments and `#[cfg]` attributes; remove this one",
                        item.noun()
                    ),
                ))
            }
        })
        .collect()
}

/// The scope of a body: its generic parameters and arguments, each declared once.
fn signature_scope<'a>(
    params: &[SpecParamDef],
    args: impl Iterator<Item = (&'a Ident, bool)> + Clone,
    item: Item,
) -> syn::Result<Scopes> {
    let mut scopes = Scopes::new();
    let names = params
        .iter()
        .map(|param| &param.name)
        .chain(args.clone().map(|(name, _)| name));
    for (index, name) in names.clone().enumerate() {
        if names.clone().take(index).any(|earlier| earlier == name) {
            let signature = match item {
                Item::Kernel => "this kernel's signature",
                Item::Function => "this function's signature",
            };
            return Err(syn::Error::new_spanned(
                name,
                format!("`{name}` is declared twice in {signature}"),
            ));
        }
    }
    for param in params {
        let kind = match param.kind {
            SpecKind::DType => BindingKind::DTypeParam,
            SpecKind::Int | SpecKind::Bool => BindingKind::ConstParam,
        };
        scopes.bind(&param.name, kind);
    }
    for (name, mutable) in args {
        scopes.bind(name, BindingKind::Argument { mutable });
    }
    Ok(scopes)
}

/// Parses a kernel's or `#[kernel_fn]`'s body into DSL statements, resolving every name it meets.
struct BodyParser {
    scopes: Scopes,
    item: Item,
}
