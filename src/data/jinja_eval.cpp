// The Jinja engine's evaluator: walks the syntax tree over a scope chain, as Jinja2 scopes names
// (a for loop's iterations each get a fresh scope over the enclosing one, so a {% set %} inside a
// loop never leaks out of it; an if does not open one; a macro's call opens one over the scope it
// was defined in). The sandbox's limits are checked as it goes: loop iterations, macro call
// depth, the size of the output and of any string built, and wall time, each refused by name
// with the template's name and line.
#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "jinja_impl.h"

namespace fsdp::data::jinja {

namespace {

struct LoopBreak {};
struct LoopContinue {};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Value builtin(Builtin f) {
  Value v = Value::with(Value::T::func);
  v.fn = std::make_shared<const Builtin>(std::move(f));
  return v;
}

}  // namespace

Evaluator::Evaluator(const Program& p, const nlohmann::ordered_json& ctx) : p_(p) {
  FSDP_CHECK(ctx.is_object(), "[jinja] {}: the context must be a JSON object, got {}", p.name, ctx.type_name());
  globals_ = std::make_shared<Scope>();
  auto& g = globals_->vars;
  g.emplace_back("range", builtin([](Evaluator& ev, Args& a, int line) {
    int64_t start = 0, stop = 0, step = 1;
    auto num = [&](size_t i) {
      if (a.pos[i].t != Value::T::integer && a.pos[i].t != Value::T::boolean)
        ev.fail(line, fmt::format("range() takes integers, got {}", type_name(a.pos[i])));
      return a.pos[i].t == Value::T::integer ? a.pos[i].i : int64_t(a.pos[i].b);
    };
    if (a.pos.size() == 1) stop = num(0);
    else if (a.pos.size() >= 2) start = num(0), stop = num(1);
    if (a.pos.size() == 3) step = num(2);
    if (a.pos.empty() || a.pos.size() > 3 || step == 0) ev.fail(line, "range() takes 1 to 3 integers, the step nonzero");
    using wide = __int128;
    const wide n128 = step > 0 ? (stop > start ? (wide(stop) - start + step - 1) / step : 0)
                               : (start > stop ? (wide(start) - stop - step - 1) / -wide(step) : 0);
    const int64_t n = n128 > 100000 ? 100001 : int64_t(n128);
    if (n > 100000) ev.fail(line, fmt::format("range() of {} items is over the sandbox's 100000", n));
    List l;
    l.reserve(size_t(std::max<int64_t>(n, 0)));
    for (int64_t k = 0; k < n; ++k) l.push_back(Value::integer(start + k * step));
    return Value::list(std::move(l));
  }));
  auto make_dict = [](bool ns) {
    return builtin([ns](Evaluator& ev, Args& a, int line) {
      Dict d;
      d.is_namespace = ns;
      for (const auto& x : a.pos) {
        if (x.t != Value::T::dict) ev.fail(line, fmt::format("{}() takes a dict or keywords", ns ? "namespace" : "dict"));
        for (const auto& [k, v] : x.d->items) d.set(k, v);
      }
      for (auto& [k, v] : a.kw) d.set(k, v);
      const uint32_t depth = depth_of(d);
      if (depth > kMaxValueDepth) ev.fail(line, fmt::format("a dict nested deeper than {} levels", kMaxValueDepth));
      Value v = Value::dict(std::move(d));
      v.depth = depth;
      return v;
    });
  };
  g.emplace_back("dict", make_dict(false));
  g.emplace_back("namespace", make_dict(true));
  g.emplace_back("raise_exception", builtin([](Evaluator& ev, Args& a, int line) -> Value {
    const Value* m = a.get(0, "message");
    ev.fail(line, "the template raised an exception: " + (m ? to_str(*m) : std::string()));
  }));
  g.emplace_back("strftime_now", builtin([](Evaluator& ev, Args& a, int line) {
    const Value* f = a.get(0, "format");
    if (!f || f->t != Value::T::string) ev.fail(line, "strftime_now() takes a format string");
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[256];
    size_t n = std::strftime(buf, sizeof buf, f->s.c_str(), &tm);
    return Value::string(std::string(buf, n));
  }));
  for (const auto& [k, v] : ctx.items()) globals_->set(k, from_json(v));
}

void Evaluator::fail(int line, const std::string& what) const {
  FSDP_FAIL("[jinja] {}:{}: {}", p_.name, line, what);
}

void Evaluator::check_size(size_t bytes, int line) const {
  if (bytes > p_.limits.max_output_bytes)
    fail(line, fmt::format("a string of {} bytes is over the output-size limit ({} bytes)", bytes,
                           p_.limits.max_output_bytes));
}

void Evaluator::count_iterations(int64_t n, int line) {
  iterations_ += n;
  if (iterations_ > p_.limits.max_loop_iterations)
    fail(line, fmt::format("over the loop-iteration limit ({} iterations)", p_.limits.max_loop_iterations));
  tick(line);
}

void Evaluator::tick(int line) {
  static thread_local int counter = 0;
  if ((++counter & 255) == 0 && now_s() > deadline_)
    fail(line, fmt::format("over the time limit ({} s)", p_.limits.max_seconds));
}

Rendered Evaluator::run() {
  deadline_ = now_s() + p_.limits.max_seconds;
  exec(p_.body, globals_, out_);
  return Rendered{std::move(out_), std::move(spans_)};
}

void Evaluator::exec(const std::vector<Node>& body, const std::shared_ptr<Scope>& sc, std::string& out) {
  for (const Node& n : body) exec_node(n, sc, out);
}

void Evaluator::exec_node(const Node& n, const std::shared_ptr<Scope>& sc, std::string& out) {
  Frame frame(*this, n.line);
  tick(n.line);
  switch (n.k) {
    case Node::K::text: out += n.text; break;
    case Node::K::output: {
      Value v = eval(*n.expr, sc);
      if (v.t == Value::T::list && v.seq == Value::Seq::generator)
        fail(n.line, "printing a generator (Python prints its address) is refused");
      if (v.t == Value::T::string) out += v.s;
      else out += to_str(v);
      break;
    }
    case Node::K::if_:
      for (size_t i = 0; i < n.bodies.size(); ++i) {
        if (i < n.conds.size() && !truthy(eval(*n.conds[i], sc))) continue;
        exec(n.bodies[i], sc, out);
        break;
      }
      break;
    case Node::K::for_: {
      Value seq = eval(*n.expr, sc);
      List owned;
      const List* list = &owned;  // a plain list is iterated in place, never copied
      if (seq.t == Value::T::list && seq.seq != Value::Seq::generator) {
        list = seq.l.get();
      } else if (seq.t == Value::T::list) {
        owned = std::move(*seq.l);
        seq.l->clear();  // a generator is read once
      } else if (seq.t == Value::T::dict) {
        for (const auto& kv : seq.d->items) owned.push_back(key_value(kv.first));
      } else if (seq.t == Value::T::string) {
        auto cps = code_points(seq.s);
        for (size_t i = 0; i < cps.size(); ++i) owned.push_back(Value::string(utf8(cps, i, i + 1)));
      } else if (seq.t != Value::T::undefined) {
        fail(n.line, fmt::format("'{}' object is not iterable", type_name(seq)));
      }
      if (n.cond) {
        List kept;
        for (const auto& x : *list) {
          auto it = std::make_shared<Scope>();
          it->parent = sc;
          if (n.targets.size() == 1) it->set(n.targets[0], x);
          else if (x.t == Value::T::list && x.l->size() == n.targets.size())
            for (size_t k = 0; k < n.targets.size(); ++k) it->set(n.targets[k], (*x.l)[k]);
          count_iterations(1, n.line);
          if (truthy(eval(*n.cond, it))) kept.push_back(x);
        }
        owned = std::move(kept);
        list = &owned;
      }
      const List& items = *list;
      const int64_t len = int64_t(items.size());
      // One loop object per loop, its fields updated in place each iteration (building it anew
      // each time was most of a short loop's cost).
      auto index = std::make_shared<int64_t>(0);
      Value loop = Value::dict();
      loop.d->items = {{"index", Value::integer(1)},     {"index0", Value::integer(0)},
                       {"revindex", Value::integer(len)}, {"revindex0", Value::integer(len - 1)},
                       {"first", Value::boolean(true)},   {"last", Value::boolean(len == 1)},
                       {"length", Value::integer(len)},   {"depth", Value::integer(1)},
                       {"depth0", Value::integer(0)},     {"previtem", Value::undefined("previtem")},
                       {"nextitem", Value::undefined("nextitem")}};
      loop.d->items.emplace_back("cycle", builtin([index](Evaluator& ev, Args& a, int line) {
        if (a.pos.empty()) ev.fail(line, "loop.cycle() needs at least one value");
        return a.pos[size_t(*index) % a.pos.size()];
      }));
      auto& f = loop.d->items;
      for (int64_t i = 0; i < len; ++i) {
        count_iterations(1, n.line);
        auto it = std::make_shared<Scope>();
        it->parent = sc;
        const Value& x = items[size_t(i)];
        if (n.targets.size() == 1) {
          it->set(n.targets[0], x);
        } else {
          if (x.t != Value::T::list || x.l->size() != n.targets.size())
            fail(n.line, fmt::format("cannot unpack a {} into {} loop variables", type_name(x), n.targets.size()));
          for (size_t k = 0; k < n.targets.size(); ++k) it->set(n.targets[k], (*x.l)[k]);
        }
        *index = i;
        f[0].second.i = i + 1;
        f[1].second.i = i;
        f[2].second.i = len - i;
        f[3].second.i = len - i - 1;
        f[4].second.b = i == 0;
        f[5].second.b = i == len - 1;
        f[9].second = i > 0 ? items[size_t(i - 1)] : Value::undefined("previtem");
        f[10].second = i + 1 < len ? items[size_t(i + 1)] : Value::undefined("nextitem");
        it->vars.emplace_back("loop", loop);
        try {
          exec(n.bodies[0], it, out);
        } catch (const LoopBreak&) {
          break;
        } catch (const LoopContinue&) {
        }
      }
      if (len == 0 && n.bodies.size() > 1) exec(n.bodies[1], sc, out);
      break;
    }
    case Node::K::set: {
      Value v = eval(*n.expr, sc);
      if (n.attr_target) {
        const Value* ns = sc->find(n.targets[0]);
        if (!ns || ns->t != Value::T::dict || !ns->d->is_namespace)
          fail(n.line, fmt::format("cannot assign an attribute of '{}', which is not a namespace", n.targets[0]));
        if (n.targets[1].starts_with("_"))
          fail(n.line, fmt::format("a namespace's attribute '{}' starts with an underscore (refused)", n.targets[1]));
        if (v.depth + 1 > kMaxValueDepth)
          fail(n.line, fmt::format("a namespace nested deeper than {} levels", kMaxValueDepth));
        const_cast<Value*>(ns)->depth = std::max<uint32_t>(ns->depth, uint32_t(v.depth + 1));
        ns->d->set(n.targets[1], std::move(v));
      } else if (n.targets.size() == 1) {
        sc->set(n.targets[0], std::move(v));
      } else {
        if (v.t != Value::T::list || v.l->size() != n.targets.size())
          fail(n.line, fmt::format("cannot unpack a {} into {} names", type_name(v), n.targets.size()));
        for (size_t k = 0; k < n.targets.size(); ++k) sc->set(n.targets[k], (*v.l)[k]);
      }
      break;
    }
    case Node::K::set_block: {
      std::string s;
      exec(n.bodies[0], sc, s);
      sc->set(n.targets[0], Value::string(std::move(s)));
      break;
    }
    case Node::K::macro: {
      Value m = Value::with(Value::T::func);
      m.macro = std::make_shared<const Macro>(Macro{&n, sc});
      sc->set(n.text, std::move(m));
      break;
    }
    case Node::K::call_block: {
      const Expr& c = *n.expr;
      Value callee = eval(*c.a[0], sc);
      if (!callee.macro) fail(n.line, "{% call %} of something that is not a macro");
      Args args = eval_args(c, sc);
      // caller(): the call block's body as a macro over this scope.
      Value caller = Value::with(Value::T::func);
      caller.macro = std::make_shared<const Macro>(Macro{&n, sc});
      auto body_scope = std::make_shared<Scope>();
      body_scope->vars.emplace_back("caller", caller);
      out += to_str(call_macro(*callee.macro, args, body_scope, n.line));
      break;
    }
    case Node::K::filter_block: {
      std::string s;
      exec(n.bodies[0], sc, s);
      Args none;
      out += to_str(apply_filter(*this, n.text, Value::string(std::move(s)), none, n.line));
      break;
    }
    case Node::K::break_: throw LoopBreak{};
    case Node::K::continue_: throw LoopContinue{};
    case Node::K::generation: {
      size_t begin = out.size();
      exec(n.bodies[0], sc, out);
      if (&out == &out_) spans_.emplace_back(begin, out.size());
      break;
    }
  }
  check_size(out.size(), n.line);
}

Value Evaluator::call_macro(const Macro& m, Args& args, const std::shared_ptr<Scope>& extra, int line) {
  if (++depth_ > p_.limits.max_call_depth) {
    --depth_;
    fail(line, fmt::format("over the call-depth limit ({} nested macro calls)", p_.limits.max_call_depth));
  }
  struct Down {
    int& d;
    ~Down() { --d; }
  } down{depth_};
  const Node& n = *m.node;
  auto sc = std::make_shared<Scope>();
  sc->parent = m.closure;
  if (extra) sc->vars = extra->vars;
  size_t used = 0;
  for (size_t k = 0; k < n.params.size(); ++k) {
    const Value* v = k < args.pos.size() ? &args.pos[k] : nullptr;
    for (const auto& [kn, kv] : args.kw)
      if (kn == n.params[k]) v = &kv;
    if (v) {
      sc->set(n.params[k], *v);
      ++used;
    } else if (n.conds[k]) {
      sc->set(n.params[k], eval(*n.conds[k], sc));
    } else {
      sc->set(n.params[k], Value::undefined(n.params[k]));
    }
  }
  List varargs;
  for (size_t k = n.params.size(); k < args.pos.size(); ++k) varargs.push_back(args.pos[k]);
  Value va = Value::list(std::move(varargs));
  va.tuple = true;
  sc->set("varargs", va);
  Dict kwargs;
  for (const auto& [kn, kv] : args.kw) {
    bool known = false;
    for (const auto& p : n.params) known = known || p == kn;
    if (!known) kwargs.set(kn, kv);
  }
  sc->set("kwargs", Value::dict(std::move(kwargs)));
  (void)used;
  std::string s;
  exec(n.bodies[0], sc, s);
  return Value::string(std::move(s));
}

Value Evaluator::call(const Value& callee, Args& args, int line) {
  if (callee.fn) return (*callee.fn)(*this, args, line);
  if (callee.macro) return call_macro(*callee.macro, args, nullptr, line);
  if (callee.is_undefined()) fail(line, fmt::format("'{}' is undefined (called)", callee.s));
  fail(line, fmt::format("'{}' object is not callable", type_name(callee)));
}

}  // namespace fsdp::data::jinja
