//! The signature of a kernel or `#[kernel_fn]`: generic parameters are specialisation
//! parameters; a kernel's arguments are pointers and scalars, a function's any DSL values, with
//! its result types. Anything else in the `fn`'s header is refused.

use syn::{
    FnArg, GenericArgument, GenericParam, Generics, Ident, Pat, PathArguments, ReturnType,
    Signature, Type,
};

use super::Item;
use super::model::{ArgDef, ArgType, DType, DTypeRef, FnArgDef, FnType, SpecKind, SpecParamDef};

/// Checks the `fn`'s qualifiers, and a kernel's return type: a kernel is a plain `fn` that
/// returns nothing.
pub(crate) fn check_header(signature: &Signature, item: Item) -> syn::Result<()> {
    let noun = item.noun();
    if let Some(constness) = &signature.constness {
        return Err(syn::Error::new_spanned(
            constness,
            format!("{noun} cannot be a `const fn`; remove `const`"),
        ));
    }
    if let Some(asyncness) = &signature.asyncness {
        return Err(syn::Error::new_spanned(
            asyncness,
            format!("{noun} cannot be an `async fn`; remove `async`"),
        ));
    }
    if let Some(unsafety) = &signature.unsafety {
        return Err(syn::Error::new_spanned(
            unsafety,
            format!("{noun} cannot be an `unsafe fn`; remove `unsafe`"),
        ));
    }
    if let Some(abi) = &signature.abi {
        return Err(syn::Error::new_spanned(
            abi,
            format!("{noun} cannot declare an ABI; remove it"),
        ));
    }
    if let Some(variadic) = &signature.variadic {
        return Err(syn::Error::new_spanned(
            variadic,
            format!("{noun} cannot be variadic"),
        ));
    }
    if item == Item::Kernel
        && let ReturnType::Type(..) = &signature.output
    {
        return Err(syn::Error::new_spanned(
            &signature.output,
            "a kernel returns nothing; write results through a pointer argument with `store`",
        ));
    }
    Ok(())
}

/// The generic parameters: type parameters are dtypes, `const` parameters integers or bools.
pub(crate) fn parse_params(generics: &Generics, item: Item) -> syn::Result<Vec<SpecParamDef>> {
    let noun = item.noun();
    if let Some(where_clause) = &generics.where_clause {
        return Err(syn::Error::new_spanned(
            where_clause,
            format!(
                "{noun} cannot have a `where` clause; type parameters are dtypes and need no bounds"
            ),
        ));
    }
    let no_defaults = match item {
        Item::Kernel => {
            "specialisation parameters have no defaults; give every value in the `Spec`"
        }
        Item::Function => {
            "the generic parameters of a `#[kernel_fn]` have no defaults; every call passes them \
             all, as in `f::<T, BLOCK>(..)`"
        }
    };
    generics
        .params
        .iter()
        .map(|param| match param {
            GenericParam::Lifetime(lifetime) => Err(syn::Error::new_spanned(
                lifetime,
                format!("{noun} cannot have lifetime parameters"),
            )),
            GenericParam::Type(type_param) => {
                if let Some(default) = &type_param.default {
                    return Err(syn::Error::new_spanned(default, no_defaults));
                }
                Ok(SpecParamDef {
                    name: type_param.ident.clone(),
                    kind: SpecKind::DType,
                })
            }
            GenericParam::Const(const_param) => {
                if let Some(default) = &const_param.default {
                    return Err(syn::Error::new_spanned(default, no_defaults));
                }
                let kind = match single_ident(&const_param.ty)
                    .map(|i| i.to_string())
                    .as_deref()
                {
                    Some("usize" | "u32" | "i32" | "i64") => SpecKind::Int,
                    Some("bool") => SpecKind::Bool,
                    _ => {
                        return Err(syn::Error::new_spanned(
                            &const_param.ty,
                            format!(
                                "a `const` parameter of {noun} must be `usize`, `u32`, `i32`, \
                                 `i64` or `bool`"
                            ),
                        ));
                    }
                };
                Ok(SpecParamDef {
                    name: const_param.ident.clone(),
                    kind,
                })
            }
        })
        .collect()
}

/// The arguments: `name: Ptr<D>` or a scalar `name: i32 | i64 | f32 | T`.
pub(crate) fn parse_args(
    signature: &Signature,
    params: &[SpecParamDef],
) -> syn::Result<Vec<ArgDef>> {
    signature
        .inputs
        .iter()
        .map(|input| {
            let (name, mutable, ty) = arg_parts(input, Item::Kernel)?;
            if ["launcher", "spec", "grid"].contains(&name.to_string().as_str()) {
                return Err(syn::Error::new_spanned(
                    &name,
                    format!(
                        "a kernel argument cannot be called `{name}`: the generated `launch` \
                         function takes `launcher`, `spec` and `grid` before the kernel's arguments"
                    ),
                ));
            }
            Ok(ArgDef {
                name,
                mutable,
                ty: parse_arg_type(ty, params)?,
            })
        })
        .collect()
}

/// A `#[kernel_fn]`'s arguments: a scalar dtype, `Ptr<D>`, `BlockPtr<D>`, `Tile`, `Tile<D>`, `_`.
pub(crate) fn parse_fn_args(
    signature: &Signature,
    params: &[SpecParamDef],
) -> syn::Result<Vec<FnArgDef>> {
    signature
        .inputs
        .iter()
        .map(|input| {
            let (name, mutable, ty) = arg_parts(input, Item::Function)?;
            Ok(FnArgDef {
                name,
                mutable,
                ty: parse_fn_type(ty, params)?,
            })
        })
        .collect()
}

/// A `#[kernel_fn]`'s result types: none, `-> T`, or `-> (A, B, ..)` of up to 8.
pub(crate) fn parse_fn_return(
    output: &ReturnType,
    params: &[SpecParamDef],
) -> syn::Result<Option<Vec<FnType>>> {
    let ReturnType::Type(_, ty) = output else {
        return Ok(None);
    };
    match &**ty {
        Type::Tuple(tuple) if tuple.elems.is_empty() => Err(syn::Error::new_spanned(
            output,
            "a `#[kernel_fn]` that gives nothing declares no result type; remove `-> ()`",
        )),
        Type::Tuple(tuple) if tuple.elems.len() == 1 => Err(syn::Error::new_spanned(
            tuple,
            "a `#[kernel_fn]` that gives one value declares it without a tuple, as in `-> i32`",
        )),
        Type::Tuple(tuple) if tuple.elems.len() > MAX_RESULTS => Err(syn::Error::new_spanned(
            tuple,
            format!("a `#[kernel_fn]` gives at most {MAX_RESULTS} values"),
        )),
        Type::Tuple(tuple) => tuple
            .elems
            .iter()
            .map(|element| parse_fn_type(element, params))
            .collect::<syn::Result<Vec<_>>>()
            .map(Some),
        Type::Paren(paren) => parse_fn_type(&paren.elem, params).map(|ty| Some(vec![ty])),
        other => parse_fn_type(other, params).map(|ty| Some(vec![ty])),
    }
}

/// As many values as kiln-dsl's `FnResult` takes in a tuple.
const MAX_RESULTS: usize = 8;

/// The name, mutability and type of an argument, which must be a plain name.
fn arg_parts(input: &FnArg, item: Item) -> syn::Result<(Ident, bool, &Type)> {
    let noun = item.noun();
    let typed = match input {
        FnArg::Receiver(receiver) => {
            return Err(syn::Error::new_spanned(
                receiver,
                format!("{noun} takes no `self`; make it a free `fn`"),
            ));
        }
        FnArg::Typed(typed) => typed,
    };
    let message = match item {
        Item::Kernel => "a kernel argument must be a plain name, such as `x: Ptr<f32>`",
        Item::Function => "a `#[kernel_fn]` argument must be a plain name, such as `x: Tile`",
    };
    let Pat::Ident(pattern) = &*typed.pat else {
        return Err(syn::Error::new_spanned(&typed.pat, message));
    };
    if pattern.by_ref.is_some() || pattern.subpat.is_some() {
        return Err(syn::Error::new_spanned(pattern, message));
    }
    Ok((
        pattern.ident.clone(),
        pattern.mutability.is_some(),
        &typed.ty,
    ))
}

/// A `#[kernel_fn]` argument or result type.
fn parse_fn_type(ty: &Type, params: &[SpecParamDef]) -> syn::Result<FnType> {
    let expected = || {
        syn::Error::new_spanned(
            ty,
            format!(
                "a `#[kernel_fn]` argument or result is a scalar ({} or a type parameter), \
                 `Ptr<D>`, `BlockPtr<D>`, `Tile`, `Tile<D>` or `_` (anything)",
                DType::NAMES
            ),
        )
    };
    let type_path = match ty {
        Type::Infer(_) => return Ok(FnType::Any),
        Type::Path(type_path) if type_path.qself.is_none() => type_path,
        _ => return Err(expected()),
    };
    let last = type_path.path.segments.last().ok_or_else(expected)?;
    let element = || -> syn::Result<Option<DTypeRef>> {
        let PathArguments::AngleBracketed(arguments) = &last.arguments else {
            return Ok(None);
        };
        match arguments.args.first() {
            Some(GenericArgument::Type(element)) if arguments.args.len() == 1 => {
                let dtype = parse_signature_dtype(element, params).ok_or_else(|| {
                    syn::Error::new_spanned(
                        element,
                        format!("expected a dtype: {} or a type parameter", DType::NAMES),
                    )
                })?;
                Ok(Some(dtype))
            }
            _ => Err(syn::Error::new_spanned(
                arguments,
                format!("`{}` takes one dtype, such as `<f32>` or `<T>`", last.ident),
            )),
        }
    };
    let needs_element = |what: &str| {
        syn::Error::new_spanned(
            ty,
            format!("`{what}` needs its element type: write `{what}<f32>` or `{what}<T>`"),
        )
    };
    if last.ident == "Ptr" {
        return element()?
            .map(FnType::Ptr)
            .ok_or_else(|| needs_element("Ptr"));
    }
    if last.ident == "BlockPtr" {
        return element()?
            .map(FnType::BlockPtr)
            .ok_or_else(|| needs_element("BlockPtr"));
    }
    if last.ident == "Tile" {
        return element().map(FnType::Tile);
    }
    parse_signature_dtype(ty, params)
        .map(FnType::Scalar)
        .ok_or_else(expected)
}

fn parse_arg_type(ty: &Type, params: &[SpecParamDef]) -> syn::Result<ArgType> {
    const EXPECTED: &str =
        "a kernel argument must be `Ptr<D>` or a scalar `i32`, `i64`, `f32` or a type parameter";
    let Type::Path(type_path) = ty else {
        return Err(syn::Error::new_spanned(ty, EXPECTED));
    };
    let last = type_path
        .path
        .segments
        .last()
        .ok_or_else(|| syn::Error::new_spanned(ty, EXPECTED))?;
    if last.ident == "Ptr" && type_path.qself.is_none() {
        let PathArguments::AngleBracketed(arguments) = &last.arguments else {
            return Err(syn::Error::new_spanned(
                ty,
                "`Ptr` needs its element type: write `Ptr<f32>` or `Ptr<T>`",
            ));
        };
        let element = match arguments.args.first() {
            Some(GenericArgument::Type(element)) if arguments.args.len() == 1 => element,
            _ => {
                return Err(syn::Error::new_spanned(
                    arguments,
                    "`Ptr` takes exactly one element type, such as `Ptr<f32>` or `Ptr<T>`",
                ));
            }
        };
        let dtype = parse_signature_dtype(element, params).ok_or_else(|| {
            syn::Error::new_spanned(
                element,
                format!(
                    "a pointer's element type must be {} or a type parameter",
                    DType::NAMES
                ),
            )
        })?;
        return Ok(ArgType::Ptr(dtype));
    }
    match single_ident(ty) {
        Some(ident) if is_type_param(ident, params) => {
            Ok(ArgType::Scalar(DTypeRef::Param(ident.clone())))
        }
        Some(ident) if ident == "i32" || ident == "i64" || ident == "f32" => {
            let dtype = DType::from_name(&ident.to_string()).expect("a DSL dtype name");
            Ok(ArgType::Scalar(DTypeRef::Fixed(dtype)))
        }
        _ => Err(syn::Error::new_spanned(ty, EXPECTED)),
    }
}

/// A dtype written as a type: a DSL dtype name or one of the kernel's type parameters.
fn parse_signature_dtype(ty: &Type, params: &[SpecParamDef]) -> Option<DTypeRef> {
    let ident = single_ident(ty)?;
    if is_type_param(ident, params) {
        return Some(DTypeRef::Param(ident.clone()));
    }
    DType::from_name(&ident.to_string()).map(DTypeRef::Fixed)
}

fn is_type_param(ident: &Ident, params: &[SpecParamDef]) -> bool {
    params
        .iter()
        .any(|param| param.kind == SpecKind::DType && param.name == *ident)
}

/// The identifier of a type that is one plain name (`f32`, `T`), if it is one.
fn single_ident(ty: &Type) -> Option<&Ident> {
    match ty {
        Type::Path(type_path) if type_path.qself.is_none() => type_path.path.get_ident(),
        _ => None,
    }
}
