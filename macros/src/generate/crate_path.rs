//! The path generated code names kiln-dsl by, found from the calling package's `Cargo.toml`.

use proc_macro_crate::{FoundCrate, crate_name};
use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::Ident;

/// `::kiln_dsl` where the caller depends on kiln-dsl or is kiln-dsl (which declares
/// `extern crate self as kiln_dsl`), `::kiln::dsl` where it depends on the facade, under either
/// crate's renamed name; `::kiln_dsl` where neither is found.
pub(crate) fn dsl_crate_path() -> TokenStream {
    match crate_name("kiln-dsl") {
        Ok(FoundCrate::Itself) => return quote!(::kiln_dsl),
        Ok(FoundCrate::Name(name)) => {
            let name = Ident::new(&name, Span::call_site());
            return quote!(::#name);
        }
        Err(_) => {}
    }
    match crate_name("kiln") {
        // Unreached while the facade depends on kiln-dsl (found above); otherwise the facade
        // would need `extern crate self as kiln`, as kiln-dsl names itself.
        Ok(FoundCrate::Itself) => quote!(::kiln::dsl),
        Ok(FoundCrate::Name(name)) => {
            let name = Ident::new(&name, Span::call_site());
            quote!(::#name::dsl)
        }
        Err(_) => quote!(::kiln_dsl),
    }
}
