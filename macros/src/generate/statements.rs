//! Statements -> Rust statements. Variables are Rust variables holding `Value`s; a `for` or `if`
//! passes the variables it carries through the builder's regions and rebinds them after. An `if`
//! used as a value is here too: it is a statement `if` whose branches also give a value.

use proc_macro2::{Span, TokenStream};
use quote::quote;

use super::Generator;
use super::expressions::Operand;
use crate::parse::model::{Block, Expr, ForLoop, IfElse, IfValue, Stmt, ValueBlock};

impl Generator {
    pub(super) fn block(&self, block: &Block) -> TokenStream {
        let stmts = block.stmts.iter().map(|stmt| self.stmt(stmt));
        quote!(#(#stmts)*)
    }

    fn stmt(&self, stmt: &Stmt) -> TokenStream {
        match stmt {
            Stmt::Let { name, value } => {
                let value = self.expr(value);
                let name_string = name.to_string();
                quote_internal! {
                    let mut #name = #value;
                    __kiln.name(#name, #name_string);
                }
            }
            Stmt::Assign { name, value } => {
                let value = self.expr(value);
                let name_string = name.to_string();
                quote_internal! {
                    #name = #value;
                    __kiln.name(#name, #name_string);
                }
            }
            Stmt::Store {
                ptr,
                value,
                mask,
                span,
            }
            | Stmt::AtomicAdd {
                ptr,
                value,
                mask,
                span,
            } => {
                let name = match stmt {
                    Stmt::Store { .. } => "store",
                    _ => "atomic_add",
                };
                let mask = Operand::Optional(mask.as_ref());
                self.write_call(name, ptr, value, mask, *span)
            }
            Stmt::StoreBlock {
                ptr,
                value,
                boundary_check,
                span,
            }
            | Stmt::AtomicAddBlock {
                ptr,
                value,
                boundary_check,
                span,
            } => {
                let name = match stmt {
                    Stmt::StoreBlock { .. } => "store_block",
                    _ => "atomic_add_block",
                };
                self.write_call(name, ptr, value, Operand::List(boundary_check), *span)
            }
            Stmt::StaticAssert {
                cond,
                message,
                span,
            } => {
                let message = match message {
                    Some(message) => quote_internal!(::core::option::Option::Some(#message)),
                    None => quote_internal!(::core::option::Option::None),
                };
                let operands = vec![Operand::Value(cond), Operand::Tokens(message)];
                let call = self.builder_call("static_assert", operands, *span);
                quote!(#call;)
            }
            Stmt::GridControl { wait, span } => {
                let dsl = &self.dsl;
                let control = if *wait {
                    quote!(#dsl::GridControl::WaitForPriorGrids)
                } else {
                    quote!(#dsl::GridControl::LaunchDependentGrids)
                };
                let call = self.builder_call("grid_control", vec![Operand::Tokens(control)], *span);
                quote!(#call;)
            }
            Stmt::For(for_loop) => self.for_loop(for_loop),
            Stmt::If(if_else) => self.if_else(if_else),
            Stmt::Call(call) => {
                let call = self.fn_call(call, quote!(()));
                quote!(#call;)
            }
            Stmt::LetTuple { names, call } => {
                let dsl = &self.dsl;
                let values = names.iter().map(|_| quote!(#dsl::Value));
                let call = self.fn_call(call, quote!((#(#values),*)));
                let patterns = names.iter().map(|name| match name {
                    Some(name) => quote_internal!(mut #name),
                    None => quote!(_),
                });
                let named = names.iter().flatten().map(|name| {
                    let name_string = name.to_string();
                    quote_internal!(__kiln.name(#name, #name_string);)
                });
                quote_internal! {
                    let (#(#patterns),*) = #call;
                    #(#named)*
                }
            }
        }
    }

    /// `store` or `atomic_add`: through pointers with an optional mask, or through a block
    /// pointer with its checked axes (`last`).
    fn write_call(
        &self,
        builder_fn: &str,
        ptr: &Expr,
        value: &Expr,
        last: Operand<'_>,
        span: Span,
    ) -> TokenStream {
        let operands = vec![Operand::Value(ptr), Operand::Value(value), last];
        let call = self.builder_call(builder_fn, operands, span);
        quote!(#call;)
    }

    /// The body sees the carried variables as the loop region's parameters and yields their
    /// final values; after the loop they are the loop's results.
    fn for_loop(&self, for_loop: &ForLoop) -> TokenStream {
        let dsl = &self.dsl;
        let loc = self.loc(for_loop.span);
        let lower = self.expr(&for_loop.lower);
        let upper = self.expr(&for_loop.upper);
        let step = match &for_loop.step {
            Some(step) => self.expr(step),
            None => quote_internal!(__kiln.int(1, #loc)),
        };
        let induction = for_loop.induction.as_ref().map(|name| {
            let name_string = name.to_string();
            quote_internal! {
                let #name = __kiln_scope.induction;
                __kiln.name(#name, #name_string);
            }
        });
        let carried = &for_loop.carried;
        let carried_names: Vec<String> = carried.iter().map(|name| name.to_string()).collect();
        let indices: Vec<usize> = (0..carried.len()).collect();
        let count = carried.len();
        let body = self.block(&for_loop.body);
        quote_internal! {
            {
                let __kiln_lower = #lower;
                let __kiln_upper = #upper;
                let __kiln_step = #step;
                let __kiln_scope = __kiln.begin_for(
                    __kiln_lower,
                    __kiln_upper,
                    __kiln_step,
                    &[#(#carried),*],
                    &[#(#carried_names),*],
                    #loc
                )?;
                #induction
                let __kiln_yields: [#dsl::Value; #count] = {
                    #(let mut #carried = __kiln_scope.carried[#indices];)*
                    { #body }
                    [#(#carried),*]
                };
                let __kiln_results = __kiln.end_for(__kiln_scope, &__kiln_yields, #loc)?;
                #(#carried = __kiln_results[#indices];)*
            }
        }
    }

    /// Each branch is a closure from the builder to the carried variables' final values, so that
    /// it is written once: a condition known while building (a bool specialisation parameter, a
    /// folded comparison) runs only the branch taken, so the other is never built; a runtime
    /// condition runs both inside the builder's `if` regions.
    fn if_else(&self, if_else: &IfElse) -> TokenStream {
        let loc = self.loc(if_else.span);
        let cond = self.expr(&if_else.cond);
        let carried = &if_else.carried;
        let carried_names: Vec<String> = carried.iter().map(|name| name.to_string()).collect();
        let indices: Vec<usize> = (0..carried.len()).collect();
        let then_branch = self.branch(&self.block(&if_else.then_block), carried);
        // Without `else`, the else branch yields every carried variable unchanged.
        let else_body = if_else.else_block.as_ref().map(|block| self.block(block));
        let else_branch = self.branch(&else_body.unwrap_or_default(), carried);
        quote_internal! {
            {
                let __kiln_condition = #cond;
                let __kiln_then_branch = #then_branch;
                let __kiln_else_branch = #else_branch;
                let __kiln_results = match __kiln.static_bool(__kiln_condition) {
                    ::core::option::Option::Some(true) => __kiln_then_branch(__kiln)?,
                    ::core::option::Option::Some(false) => __kiln_else_branch(__kiln)?,
                    ::core::option::Option::None => {
                        let mut __kiln_scope = __kiln.begin_if(
                            __kiln_condition,
                            &[#(#carried),*],
                            &[#(#carried_names),*],
                            #loc
                        )?;
                        let __kiln_then_yields = __kiln_then_branch(__kiln)?;
                        __kiln.begin_else(&mut __kiln_scope, &__kiln_then_yields, #loc)?;
                        let __kiln_else_yields = __kiln_else_branch(__kiln)?;
                        __kiln.end_if(__kiln_scope, &__kiln_else_yields, #loc)?
                    }
                };
                #(#carried = __kiln_results[#indices];)*
            }
        }
    }

    /// `|__kiln| { let mut carried = carried; body; Ok(vec![carried, ..]) }`
    fn branch(&self, body: &TokenStream, carried: &[syn::Ident]) -> TokenStream {
        let dsl = &self.dsl;
        quote_internal! {
            |__kiln: &mut #dsl::Builder| -> #dsl::Result<::std::vec::Vec<#dsl::Value>> {
                #(let mut #carried = #carried;)*
                { #body }
                ::core::result::Result::Ok(::std::vec![#(#carried),*])
            }
        }
    }

    /// An `if` used as a value, as an expression: built as a statement `if` is, with each branch
    /// also giving its value (a constant condition builds only the branch taken, whose value is
    /// the `if`'s); a runtime condition gives one IR `if` whose results are the carried variables
    /// followed by the value.
    pub(super) fn if_value(&self, if_value: &IfValue) -> TokenStream {
        let loc = self.loc(if_value.span);
        let cond = self.expr(&if_value.cond);
        let carried = &if_value.carried;
        let carried_names: Vec<String> = carried.iter().map(|name| name.to_string()).collect();
        let indices: Vec<usize> = (0..carried.len()).collect();
        let then_branch = self.value_branch(&if_value.then_branch, carried);
        let else_branch = self.value_branch(&if_value.else_branch, carried);
        quote_internal! {
            {
                let __kiln_condition = #cond;
                let __kiln_then_branch = #then_branch;
                let __kiln_else_branch = #else_branch;
                let (__kiln_results, __kiln_value) = match __kiln.static_bool(__kiln_condition) {
                    ::core::option::Option::Some(true) => __kiln_then_branch(__kiln)?,
                    ::core::option::Option::Some(false) => __kiln_else_branch(__kiln)?,
                    ::core::option::Option::None => {
                        let mut __kiln_scope = __kiln.begin_if(
                            __kiln_condition,
                            &[#(#carried),*],
                            &[#(#carried_names),*],
                            #loc
                        )?;
                        let (__kiln_then_yields, __kiln_then_value) = __kiln_then_branch(__kiln)?;
                        __kiln.begin_else_with_value(
                            &mut __kiln_scope,
                            &__kiln_then_yields,
                            __kiln_then_value,
                            #loc
                        )?;
                        let (__kiln_else_yields, __kiln_else_value) = __kiln_else_branch(__kiln)?;
                        __kiln.end_if_with_value(
                            __kiln_scope,
                            &__kiln_else_yields,
                            __kiln_else_value,
                            #loc
                        )?
                    }
                };
                #(#carried = __kiln_results[#indices];)*
                __kiln_value
            }
        }
    }

    /// `|__kiln| { let mut carried = carried; let value = { body; value }; Ok((vec![carried, ..], value)) }`
    fn value_branch(&self, branch: &ValueBlock, carried: &[syn::Ident]) -> TokenStream {
        let dsl = &self.dsl;
        let body = self.block(&branch.block);
        let value = self.expr(&branch.value);
        quote_internal! {
            |__kiln: &mut #dsl::Builder|
                -> #dsl::Result<(::std::vec::Vec<#dsl::Value>, #dsl::Value)>
            {
                #(let mut #carried = #carried;)*
                let __kiln_value = { #body #value };
                ::core::result::Result::Ok((::std::vec![#(#carried),*], __kiln_value))
            }
        }
    }
}
