//! kiln-macros: `#[kiln::kernel]` (placeholder while the parser is written).
use proc_macro::TokenStream;

#[proc_macro_attribute]
pub fn kernel(_attr: TokenStream, item: TokenStream) -> TokenStream {
    item
}
