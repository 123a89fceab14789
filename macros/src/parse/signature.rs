//! The kernel's signature: generic parameters are specialisation parameters, arguments are
//! pointers and scalars. Anything else in the `fn`'s header is refused.

use syn::{
    FnArg, GenericArgument, GenericParam, Generics, Ident, Pat, PathArguments, ReturnType,
    Signature, Type,
};

use super::model::{ArgDef, ArgType, DType, DTypeRef, SpecKind, SpecParamDef};

/// Checks the `fn`'s qualifiers and return type: a kernel is a plain `fn` that returns nothing.
pub(crate) fn check_header(signature: &Signature) -> syn::Result<()> {
    if let Some(constness) = &signature.constness {
        return Err(syn::Error::new_spanned(
            constness,
            "a kernel cannot be a `const fn`; remove `const`",
        ));
    }
    if let Some(asyncness) = &signature.asyncness {
        return Err(syn::Error::new_spanned(
            asyncness,
            "a kernel cannot be an `async fn`; remove `async`",
        ));
    }
    if let Some(unsafety) = &signature.unsafety {
        return Err(syn::Error::new_spanned(
            unsafety,
            "a kernel cannot be an `unsafe fn`; remove `unsafe`",
        ));
    }
    if let Some(abi) = &signature.abi {
        return Err(syn::Error::new_spanned(
            abi,
            "a kernel cannot declare an ABI; remove it",
        ));
    }
    if let Some(variadic) = &signature.variadic {
        return Err(syn::Error::new_spanned(
            variadic,
            "a kernel cannot be variadic",
        ));
    }
    if let ReturnType::Type(..) = &signature.output {
        return Err(syn::Error::new_spanned(
            &signature.output,
            "a kernel returns nothing; write results through a pointer argument with `store`",
        ));
    }
    Ok(())
}

/// The generic parameters: type parameters are dtypes, `const` parameters integers or bools.
pub(crate) fn parse_params(generics: &Generics) -> syn::Result<Vec<SpecParamDef>> {
    if let Some(where_clause) = &generics.where_clause {
        return Err(syn::Error::new_spanned(
            where_clause,
            "a kernel cannot have a `where` clause; type parameters are dtypes and need no bounds",
        ));
    }
    generics
        .params
        .iter()
        .map(|param| match param {
            GenericParam::Lifetime(lifetime) => Err(syn::Error::new_spanned(
                lifetime,
                "a kernel cannot have lifetime parameters",
            )),
            GenericParam::Type(type_param) => {
                if let Some(default) = &type_param.default {
                    return Err(syn::Error::new_spanned(
                        default,
                        "specialisation parameters have no defaults; give every value in the `Spec`",
                    ));
                }
                Ok(SpecParamDef {
                    name: type_param.ident.clone(),
                    kind: SpecKind::DType,
                })
            }
            GenericParam::Const(const_param) => {
                if let Some(default) = &const_param.default {
                    return Err(syn::Error::new_spanned(
                        default,
                        "specialisation parameters have no defaults; give every value in the `Spec`",
                    ));
                }
                let kind = match single_ident(&const_param.ty).map(|i| i.to_string()).as_deref() {
                    Some("usize" | "u32" | "i32" | "i64") => SpecKind::Int,
                    Some("bool") => SpecKind::Bool,
                    _ => {
                        return Err(syn::Error::new_spanned(
                            &const_param.ty,
                            "a `const` parameter of a kernel must be `usize`, `u32`, `i32`, `i64` or `bool`",
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
            let typed = match input {
                FnArg::Receiver(receiver) => {
                    return Err(syn::Error::new_spanned(
                        receiver,
                        "a kernel takes no `self`; make it a free `fn`",
                    ));
                }
                FnArg::Typed(typed) => typed,
            };
            let Pat::Ident(pattern) = &*typed.pat else {
                return Err(syn::Error::new_spanned(
                    &typed.pat,
                    "a kernel argument must be a plain name, such as `x: Ptr<f32>`",
                ));
            };
            if pattern.by_ref.is_some() || pattern.subpat.is_some() {
                return Err(syn::Error::new_spanned(
                    pattern,
                    "a kernel argument must be a plain name, such as `x: Ptr<f32>`",
                ));
            }
            Ok(ArgDef {
                name: pattern.ident.clone(),
                mutable: pattern.mutability.is_some(),
                ty: parse_arg_type(&typed.ty, params)?,
            })
        })
        .collect()
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
