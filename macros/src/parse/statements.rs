//! Statements: `let`, assignments, `store`/`static_assert` calls and calls of `#[kernel_fn]`s,
//! `for` loops and `if`s; `if`s used as values, whose branches are statements ending with a value;
//! and the body of a `#[kernel_fn]`, which ends with what it gives.

use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{BinOp, Ident, Pat, RangeLimits};

use super::functions::{Callee, is_builtin, is_effect};
use super::model::{
    BinaryOp, Block, Expr, ExprKind, FnResults, FnType, ForLoop, IfElse, IfValue, Stmt, ValueBlock,
};
use super::scope::BindingKind;
use super::{BodyParser, Item};

impl BodyParser {
    /// A `{ .. }` block: its statements, in a scope of their own.
    pub(super) fn parse_block(&mut self, block: &syn::Block) -> syn::Result<Block> {
        self.scopes.push_level();
        let mut stmts = Vec::with_capacity(block.stmts.len());
        for stmt in &block.stmts {
            stmts.push(self.parse_stmt(stmt)?);
        }
        self.scopes.pop_level();
        Ok(Block { stmts })
    }

    fn parse_stmt(&mut self, stmt: &syn::Stmt) -> syn::Result<Stmt> {
        match stmt {
            syn::Stmt::Local(local) => self.parse_let(local),
            syn::Stmt::Item(item) => Err(syn::Error::new_spanned(
                item,
                "items cannot be declared inside a kernel; declare them outside it",
            )),
            syn::Stmt::Macro(statement_macro) => Err(syn::Error::new_spanned(
                statement_macro,
                "macros are not supported in a kernel",
            )),
            syn::Stmt::Expr(expr, _) => self.parse_expr_stmt(expr),
        }
    }

    fn parse_let(&mut self, local: &syn::Local) -> syn::Result<Stmt> {
        if let Some(attribute) = local.attrs.first() {
            return Err(syn::Error::new_spanned(
                attribute,
                "attributes on `let` are not supported in a kernel",
            ));
        }
        let (name, mutable) = match &local.pat {
            Pat::Ident(pattern) if pattern.by_ref.is_none() && pattern.subpat.is_none() => {
                (pattern.ident.clone(), pattern.mutability.is_some())
            }
            Pat::Tuple(tuple) => return self.parse_let_tuple(local, tuple),
            Pat::Type(typed) => {
                return Err(syn::Error::new_spanned(
                    &typed.ty,
                    "type annotations are not supported in a kernel; the builder infers types \
                     (convert with `.to::<D>()`)",
                ));
            }
            pattern => {
                return Err(syn::Error::new_spanned(
                    pattern,
                    "a `let` in a kernel binds a plain name, such as `let x = ...`",
                ));
            }
        };
        let Some(init) = &local.init else {
            return Err(syn::Error::new_spanned(
                local,
                format!("`{name}` needs a value: write `let {name} = ...;`"),
            ));
        };
        if let Some((else_token, _)) = &init.diverge {
            return Err(syn::Error::new_spanned(
                else_token,
                "`let ... else` is not supported in a kernel",
            ));
        }
        let value = self.parse_expr(&init.expr)?;
        self.check_new_name(&name)?;
        self.scopes.bind(&name, BindingKind::Local { mutable });
        Ok(Stmt::Let { name, value })
    }

    /// `let (a, b) = f(..);`: the values of a `#[kernel_fn]` that gives a tuple, bound to plain
    /// names or `_`.
    fn parse_let_tuple(&mut self, local: &syn::Local, tuple: &syn::PatTuple) -> syn::Result<Stmt> {
        let call = match local.init.as_ref().map(|init| (&*init.expr, &init.diverge)) {
            Some((syn::Expr::Call(call), None)) => match self.callee(call)? {
                Callee::Function(path) => Some((call, path)),
                Callee::Builtin(_) => None,
            },
            _ => None,
        };
        let Some((call, path)) = call else {
            return Err(syn::Error::new_spanned(
                local,
                "a tuple pattern binds the values of a `#[kernel_fn]` that gives a tuple, as in \
                 `let (a, b) = f(..);`; bind other values one `let` at a time",
            ));
        };
        if tuple.elems.len() < 2 {
            return Err(syn::Error::new_spanned(
                tuple,
                "a tuple pattern binds two values or more, as in `let (a, b) = f(..);`",
            ));
        }
        let mut patterns = Vec::with_capacity(tuple.elems.len());
        for element in &tuple.elems {
            patterns.push(match element {
                Pat::Ident(pattern) if pattern.by_ref.is_none() && pattern.subpat.is_none() => {
                    Some((pattern.ident.clone(), pattern.mutability.is_some()))
                }
                Pat::Wild(_) => None,
                other => {
                    return Err(syn::Error::new_spanned(
                        other,
                        "each element of a tuple pattern is a plain name or `_`, as in \
                         `let (a, mut b, _) = f(..);`",
                    ));
                }
            });
        }
        let call = self.parse_fn_call(call, path)?;
        let mut names = Vec::with_capacity(patterns.len());
        for pattern in patterns {
            names.push(match pattern {
                Some((name, mutable)) => {
                    self.check_new_name(&name)?;
                    self.scopes.bind(&name, BindingKind::Local { mutable });
                    Some(name)
                }
                None => None,
            });
        }
        Ok(Stmt::LetTuple { names, call })
    }

    /// A new binding may shadow anything but a dtype parameter, which stands for a `DType` (and,
    /// in a kernel, `SIGNATURE`, which names the generated signature).
    fn check_new_name(&self, name: &Ident) -> syn::Result<()> {
        if self.item == Item::Kernel && name == "SIGNATURE" {
            return Err(syn::Error::new_spanned(
                name,
                "`SIGNATURE` names the kernel's generated signature; choose another name",
            ));
        }
        if self.scopes.lookup(name) == Some(BindingKind::DTypeParam) {
            return Err(syn::Error::new_spanned(
                name,
                format!("`{name}` is a dtype parameter of this kernel; choose another name"),
            ));
        }
        Ok(())
    }

    fn parse_expr_stmt(&mut self, expr: &syn::Expr) -> syn::Result<Stmt> {
        match expr {
            syn::Expr::Assign(assign) => {
                let name = self.parse_assignment_target(&assign.left)?;
                let value = self.parse_expr(&assign.right)?;
                Ok(Stmt::Assign { name, value })
            }
            syn::Expr::Binary(binary) if compound_assignment_op(&binary.op).is_some() => {
                let op = compound_assignment_op(&binary.op).expect("matched by the guard");
                let name = self.parse_assignment_target(&binary.left)?;
                let current = self.parse_expr(&binary.left)?;
                let operand = self.parse_expr(&binary.right)?;
                if operand.assigned().contains(&&name) {
                    // Rust would evaluate the right side first; say so rather than pick an order.
                    let op = binary.op.to_token_stream().to_string();
                    return Err(syn::Error::new_spanned(
                        &binary.right,
                        format!(
                            "this value assigns `{name}`, which `{op}` also updates; bind it with \
                             `let value = ...;` first, then write `{name} {op} value`"
                        ),
                    ));
                }
                let value = Expr {
                    kind: ExprKind::Binary(op, Box::new(current), Box::new(operand)),
                    span: binary.span(),
                };
                Ok(Stmt::Assign { name, value })
            }
            syn::Expr::Block(_) => Err(syn::Error::new_spanned(
                expr,
                "nested blocks are not supported in a kernel; write their statements without braces",
            )),
            syn::Expr::ForLoop(for_loop) => self.parse_for(for_loop).map(Stmt::For),
            syn::Expr::If(expr_if) => self.parse_if(expr_if).map(Stmt::If),
            syn::Expr::Call(call) => match self.callee(call)? {
                Callee::Builtin(name) => match self.parse_effect(call, &name)? {
                    Some(stmt) => Ok(stmt),
                    None => self.unused_value(expr),
                },
                Callee::Function(path) => self.parse_fn_call(call, path).map(Stmt::Call),
            },
            _ => self.unused_value(expr),
        }
    }

    /// An expression statement that is not an effect: refused, after refusing what is
    /// unsupported inside it, so that the more precise error wins.
    fn unused_value(&mut self, expr: &syn::Expr) -> syn::Result<Stmt> {
        self.parse_expr(expr)?;
        Err(syn::Error::new_spanned(
            expr,
            "this value is unused; bind it with `let name = ...`, or write it to memory with `store`",
        ))
    }

    /// The variable on the left of `=` or `op=`: it must be declared and assignable.
    fn parse_assignment_target(&mut self, target: &syn::Expr) -> syn::Result<Ident> {
        let name = match target {
            syn::Expr::Path(path) if path.qself.is_none() && path.attrs.is_empty() => {
                path.path.get_ident()
            }
            syn::Expr::Index(_) => {
                return Err(syn::Error::new_spanned(
                    target,
                    "cannot assign to an element of a tile; build a new tile, such as \
                     `x = where_(mask, new, x)`",
                ));
            }
            syn::Expr::Tuple(_) => {
                return Err(syn::Error::new_spanned(
                    target,
                    "a tuple cannot be assigned in a kernel; bind the values with \
                     `let (a2, b2) = f(..);`, then assign `a = a2;`",
                ));
            }
            _ => None,
        };
        let Some(name) = name else {
            return Err(syn::Error::new_spanned(
                target,
                "only a variable can be assigned in a kernel",
            ));
        };
        let message = match self.scopes.lookup(name) {
            None => {
                format!("`{name}` is not declared; declare it with `let mut {name} = ...` before")
            }
            Some(
                BindingKind::Local { mutable: true } | BindingKind::Argument { mutable: true },
            ) => {
                self.scopes.record_assignment(name);
                return Ok(name.clone());
            }
            Some(BindingKind::Local { mutable: false }) => {
                format!("cannot assign twice to `{name}`; declare it with `let mut {name} = ...`")
            }
            Some(BindingKind::Argument { mutable: false }) => {
                format!(
                    "cannot assign to argument `{name}`; declare it as `mut {name}` in the signature"
                )
            }
            Some(BindingKind::DTypeParam | BindingKind::ConstParam) => {
                format!("cannot assign to specialisation parameter `{name}`")
            }
            Some(BindingKind::LoopVariable) => {
                format!("cannot assign to loop variable `{name}`")
            }
        };
        Err(syn::Error::new_spanned(name, message))
    }

    fn parse_for(&mut self, for_loop: &syn::ExprForLoop) -> syn::Result<ForLoop> {
        if let Some(label) = &for_loop.label {
            return Err(syn::Error::new_spanned(
                label,
                "loop labels are not supported in a kernel",
            ));
        }
        let (lower, upper, step) = self.parse_for_range(&for_loop.expr)?;
        let induction = match &*for_loop.pat {
            Pat::Ident(pattern)
                if pattern.by_ref.is_none()
                    && pattern.mutability.is_none()
                    && pattern.subpat.is_none() =>
            {
                Some(pattern.ident.clone())
            }
            Pat::Wild(_) => None,
            pattern => {
                return Err(syn::Error::new_spanned(
                    pattern,
                    "a `for` loop binds a plain name or `_`, such as `for k in 0..n`",
                ));
            }
        };
        self.scopes.open_region();
        self.scopes.push_level();
        if let Some(induction) = &induction {
            self.check_new_name(induction)?;
            self.scopes.bind(induction, BindingKind::LoopVariable);
        }
        let body = self.parse_block(&for_loop.body)?;
        self.scopes.pop_level();
        let carried = self.scopes.close_region();
        Ok(ForLoop {
            induction,
            lower,
            upper,
            step,
            carried,
            body,
            span: for_loop.for_token.span,
        })
    }

    /// `start..end` or `(start..end).step_by(step)`.
    fn parse_for_range(&mut self, expr: &syn::Expr) -> syn::Result<(Expr, Expr, Option<Expr>)> {
        let (range, step) = match expr {
            syn::Expr::Range(range) => (range, None),
            syn::Expr::MethodCall(call) if call.method == "step_by" && call.args.len() == 1 => {
                match strip_parens(&call.receiver) {
                    syn::Expr::Range(range) => (range, Some(self.parse_expr(&call.args[0])?)),
                    _ => return Err(range_expected(expr)),
                }
            }
            _ => return Err(range_expected(expr)),
        };
        if let RangeLimits::Closed(dots) = &range.limits {
            return Err(syn::Error::new_spanned(
                dots,
                "inclusive ranges are not supported in a kernel; write `start..end + 1`",
            ));
        }
        let (Some(start), Some(end)) = (&range.start, &range.end) else {
            return Err(syn::Error::new_spanned(
                range,
                "a `for` range needs a start and an end, such as `0..n`",
            ));
        };
        Ok((self.parse_expr(start)?, self.parse_expr(end)?, step))
    }

    fn parse_if(&mut self, expr_if: &syn::ExprIf) -> syn::Result<IfElse> {
        let cond = self.parse_if_condition(expr_if)?;
        self.scopes.open_region();
        let then_block = self.parse_block(&expr_if.then_branch)?;
        let else_block = match &expr_if.else_branch {
            None => None,
            Some((_, else_branch)) => match &**else_branch {
                syn::Expr::Block(block) if block.label.is_none() => {
                    Some(self.parse_block(&block.block)?)
                }
                syn::Expr::If(else_if) => Some(Block {
                    stmts: vec![Stmt::If(self.parse_if(else_if)?)],
                }),
                other => {
                    return Err(syn::Error::new_spanned(
                        other,
                        "an `else` in a kernel is followed by a block or another `if`",
                    ));
                }
            },
        };
        let carried = self.scopes.close_region();
        Ok(IfElse {
            cond,
            then_block,
            else_block,
            carried,
            span: expr_if.if_token.span,
        })
    }

    fn parse_if_condition(&mut self, expr_if: &syn::ExprIf) -> syn::Result<Expr> {
        if let syn::Expr::Let(let_expr) = &*expr_if.cond {
            return Err(syn::Error::new_spanned(
                let_expr,
                "`if let` is not supported in a kernel",
            ));
        }
        self.parse_expr(&expr_if.cond)
    }

    /// An `if` used as a value: each branch ends with its value, so an `else` is required. Its
    /// branches may assign variables declared before it, as a statement `if`'s may.
    pub(super) fn parse_if_value(&mut self, expr_if: &syn::ExprIf) -> syn::Result<IfValue> {
        let cond = self.parse_if_condition(expr_if)?;
        let Some((_, else_branch)) = &expr_if.else_branch else {
            return Err(syn::Error::new_spanned(
                expr_if,
                "an `if` used as a value needs an `else` giving a value too: write \
                 `if cond { a } else { b }` (or `where_(cond, a, b)` on tiles)",
            ));
        };
        self.scopes.open_region();
        let then_branch = self.parse_value_block(&expr_if.then_branch)?;
        let else_branch = match &**else_branch {
            syn::Expr::Block(block) if block.label.is_none() => {
                self.parse_value_block(&block.block)?
            }
            syn::Expr::If(else_if) => ValueBlock {
                block: Block { stmts: Vec::new() },
                value: Expr {
                    kind: ExprKind::If(Box::new(self.parse_if_value(else_if)?)),
                    span: else_if.span(),
                },
            },
            other => {
                return Err(syn::Error::new_spanned(
                    other,
                    "an `else` in a kernel is followed by a block or another `if`",
                ));
            }
        };
        let carried = self.scopes.close_region();
        Ok(IfValue {
            cond,
            then_branch,
            else_branch,
            carried,
            span: expr_if.if_token.span,
        })
    }

    /// A branch of an `if` used as a value: statements, in a scope of their own, and the value
    /// they end with (an expression without `;`).
    fn parse_value_block(&mut self, block: &syn::Block) -> syn::Result<ValueBlock> {
        let (stmts, value) = match block.stmts.split_last() {
            Some((syn::Stmt::Expr(value, None), stmts)) => (stmts, Some(value)),
            _ => (block.stmts.as_slice(), None),
        };
        if value.is_none()
            && let Some(syn::Stmt::Expr(last, Some(semicolon))) = block.stmts.last()
            && !is_statement(last)
        {
            return Err(syn::Error::new_spanned(
                semicolon,
                "this `;` drops the value this branch should give: an `if` used as a value \
                 ends each branch with its value; remove the `;`",
            ));
        }
        self.scopes.push_level();
        let mut parsed = Vec::with_capacity(stmts.len());
        for stmt in stmts {
            parsed.push(self.parse_stmt(stmt)?);
        }
        let Some(value) = value else {
            return Err(syn::Error::new_spanned(
                block,
                "this branch of an `if` used as a value gives no value: end it with the value, \
                 without `;`, as in `if cond { ..; a } else { ..; b }`",
            ));
        };
        let value = self.parse_expr(value)?;
        self.scopes.pop_level();
        Ok(ValueBlock {
            block: Block { stmts: parsed },
            value,
        })
    }

    /// The body of a `#[kernel_fn]` that declares `returns` (`None` without `-> ..`): its
    /// statements, in a scope of their own, then the values it ends with: an expression for
    /// `-> T`, a tuple `(a, b, ..)` for `-> (A, B, ..)`.
    pub(super) fn parse_fn_body(
        &mut self,
        function: &syn::ItemFn,
        returns: Option<Vec<FnType>>,
    ) -> syn::Result<(Block, FnResults)> {
        let name = &function.sig.ident;
        let block = &function.block;
        let Some(returns) = returns else {
            if let Some(syn::Stmt::Expr(tail, None)) = block.stmts.last()
                && !is_statement(tail)
            {
                return Err(syn::Error::new_spanned(
                    tail,
                    format!(
                        "`{name}` declares no result, so this value is unused; declare what it \
                         gives, as in `-> i32`, or bind the value with `let`"
                    ),
                ));
            }
            return Ok((self.parse_block(block)?, FnResults::Nothing));
        };
        let (stmts, tail) = match block.stmts.split_last() {
            Some((syn::Stmt::Expr(tail, None), stmts)) if !gives_no_value(tail) => (stmts, tail),
            last => {
                let output = &function.sig.output;
                return Err(match last {
                    Some((syn::Stmt::Expr(last, Some(semicolon)), _)) if !is_statement(last) => {
                        syn::Error::new_spanned(
                            semicolon,
                            format!(
                                "this `;` drops the value `{name}` should give: a `#[kernel_fn]` \
                                 ends with what it gives; remove the `;`"
                            ),
                        )
                    }
                    _ => syn::Error::new_spanned(
                        output,
                        format!(
                            "`{name}` gives `{}`: end its body with {}, without `;`",
                            output
                                .to_token_stream()
                                .to_string()
                                .trim_start_matches("-> "),
                            if returns.len() == 1 {
                                "the value"
                            } else {
                                "a tuple of the values, such as `(a, b)`"
                            }
                        ),
                    ),
                });
            }
        };
        self.scopes.push_level();
        let mut parsed = Vec::with_capacity(stmts.len());
        for stmt in stmts {
            parsed.push(self.parse_stmt(stmt)?);
        }
        let count = returns.len();
        let results = match (strip_parens(tail), returns.len()) {
            (syn::Expr::Tuple(tuple), 1) => {
                return Err(syn::Error::new_spanned(
                    tuple,
                    format!(
                        "`{name}` gives one value, not a tuple; declare `-> (A, B, ..)` to give \
                         several"
                    ),
                ));
            }
            (_, 1) => {
                let ty = returns.into_iter().next().expect("one result type");
                FnResults::One(ty, self.parse_expr(tail)?)
            }
            (syn::Expr::Tuple(tuple), _) if tuple.elems.len() == count => {
                let mut results = Vec::with_capacity(count);
                for (ty, value) in returns.into_iter().zip(&tuple.elems) {
                    results.push((ty, self.parse_expr(value)?));
                }
                FnResults::Tuple(results)
            }
            (syn::Expr::Tuple(tuple), _) => {
                return Err(syn::Error::new_spanned(
                    tuple,
                    format!(
                        "`{name}` gives {count} values, this tuple has {}",
                        tuple.elems.len()
                    ),
                ));
            }
            (other, _) => {
                return Err(syn::Error::new_spanned(
                    other,
                    format!(
                        "`{name}` gives {count} values: end its body with a tuple of them, such \
                         as `(a, b)`"
                    ),
                ));
            }
        };
        self.scopes.pop_level();
        Ok((Block { stmts: parsed }, results))
    }
}

/// Whether an expression statement is one that gives no value (an assignment, a loop, an `if`, a
/// `store`), so that a `;` after it drops nothing.
fn is_statement(expr: &syn::Expr) -> bool {
    match expr {
        syn::Expr::Assign(_)
        | syn::Expr::ForLoop(_)
        | syn::Expr::While(_)
        | syn::Expr::Loop(_)
        | syn::Expr::If(_) => true,
        syn::Expr::Binary(binary) => compound_assignment_op(&binary.op).is_some(),
        // A `#[kernel_fn]` may give nothing: only the DSL's other functions surely give a value.
        syn::Expr::Call(call) => match &*call.func {
            syn::Expr::Path(path) => match path.path.get_ident() {
                Some(name) => {
                    let name = name.to_string();
                    is_effect(&name) || !is_builtin(&name)
                }
                None => true,
            },
            _ => false,
        },
        _ => false,
    }
}

/// Whether an expression is surely a statement, never a value: an assignment, a loop, a `store`.
fn gives_no_value(expr: &syn::Expr) -> bool {
    match expr {
        syn::Expr::Assign(_) | syn::Expr::ForLoop(_) | syn::Expr::While(_) | syn::Expr::Loop(_) => {
            true
        }
        syn::Expr::Binary(binary) => compound_assignment_op(&binary.op).is_some(),
        syn::Expr::Call(call) => matches!(
            &*call.func,
            syn::Expr::Path(path) if path.path.get_ident().is_some_and(|name| is_effect(&name.to_string()))
        ),
        _ => false,
    }
}

fn range_expected(expr: &syn::Expr) -> syn::Error {
    syn::Error::new_spanned(
        expr,
        "a `for` loop in a kernel runs over a range: write `for i in start..end` or \
         `for i in (start..end).step_by(step)`",
    )
}

fn strip_parens(expr: &syn::Expr) -> &syn::Expr {
    match expr {
        syn::Expr::Paren(paren) => strip_parens(&paren.expr),
        syn::Expr::Group(group) => strip_parens(&group.expr),
        _ => expr,
    }
}

/// The operator of `x op= e`, if `op` is one.
fn compound_assignment_op(op: &BinOp) -> Option<BinaryOp> {
    Some(match op {
        BinOp::AddAssign(_) => BinaryOp::Add,
        BinOp::SubAssign(_) => BinaryOp::Sub,
        BinOp::MulAssign(_) => BinaryOp::Mul,
        BinOp::DivAssign(_) => BinaryOp::Div,
        BinOp::RemAssign(_) => BinaryOp::Rem,
        BinOp::BitXorAssign(_) => BinaryOp::Xor,
        BinOp::BitAndAssign(_) => BinaryOp::And,
        BinOp::BitOrAssign(_) => BinaryOp::Or,
        BinOp::ShlAssign(_) => BinaryOp::Shl,
        BinOp::ShrAssign(_) => BinaryOp::Shr,
        _ => return None,
    })
}
