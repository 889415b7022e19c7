// Imperative vs symbolic programming (D2L 13.1, "Compilers and Interpreters"):
// the chapter's fancy_func, written once as a template over its operand type.
//
//  (a) Imperatively, on Tensors: every `+` runs as soon as it is reached
//      (on hybra's engine), like Python's interpreter running fancy_func.
//  (b) Symbolically, on Symbols made with sym::var: the same code builds a
//      graph instead of computing. graph::trace collects it, graph::run
//      interprets it with the inputs bound by name, which is what
//      `compile(evoke())` and `exec(y)` do in the chapter.
//  (c) With constant inputs the whole graph is known before it runs, so
//      graph::optimize folds it into a single constant, 10: the "compiler"
//      sees the whole program and can rewrite it.
//
//   fancy_func           prints the three parts
//   fancy_func --smoke   the same, and checks every value (the test suite's run)
#include <cstdio>
#include <hybra/hybra.hpp>
#include <iostream>
#include <sstream>
#include <string>

#include "../common/command_line.hpp"

// The chapter's program. T is hybra::Tensor (computes) or hybra::Symbol
// (adds graph nodes); `a + b` is an expression of either, converted to T.
template <class T>
T add(const T& a, const T& b) {
  return a + b;
}

template <class T>
T fancy_func(const T& a, const T& b, const T& c, const T& d) {
  T e = add(a, b);
  T f = add(c, d);
  T g = add(e, f);
  return g;
}

// The single value of a one-element tensor, as a double.
double value_of(const hybra::Tensor& t) { return t.contiguous().to_vector<double>().at(0); }

// Prints a graph (or a tensor) with every line indented.
template <class T>
void print_indented(const T& x) {
  std::ostringstream os;
  os << x;
  std::istringstream lines(os.str());
  for (std::string line; std::getline(lines, line);) std::cout << "    " << line << "\n";
}

int main(int argc, char** argv) {
  const bool smoke = example::smoke_run(argc, argv,
      "fancy_func: imperative against symbolic programming (D2L 13.1). The chapter's fancy_func run on\n"
      "Tensors, traced into a graph and run, and folded into one constant.",
      "the same, checking every value");
  namespace graph = hybra::graph;
  namespace sym = hybra::sym;
  using hybra::Symbol;
  using hybra::Tensor;
  bool ok = true;
  auto check = [&](bool cond, const char* what) {
    if (!cond) {
      std::printf("CHECK FAILED: %s\n", what);
      ok = false;
    }
  };

  // ---- (a) imperative -------------------------------------------------------
  std::cout << "(a) imperative: fancy_func on tensors\n";
  Tensor one = hybra::ones({1});
  Tensor eager = fancy_func<Tensor>(one * 1, one * 2, one * 3, one * 4);
  std::cout << "  fancy_func(ones({1}) * 1, ..., ones({1}) * 4) =\n";
  print_indented(eager);
  check(eager.shape() == hybra::Shape{1} && value_of(eager) == 10, "imperative result is [10]");

  // ---- (b) symbolic -----------------------------------------------------------
  std::cout << "\n(b) symbolic: the same code on symbols builds a graph\n";
  Symbol a = sym::var("a"), b = sym::var("b"), c = sym::var("c"), d = sym::var("d");
  Symbol out = fancy_func(a, b, c, d);
  std::cout << "  fancy_func(a, b, c, d) = " << out << "  (nothing is computed)\n";
  graph::Graph g = graph::trace({out});
  std::cout << "  graph::trace({out}):\n";
  print_indented(g);
  auto results = graph::run(g, {{"a", one * 1}, {"b", one * 2}, {"c", one * 3}, {"d", one * 4}});
  std::cout << "  graph::run with a = 1, b = 2, c = 3, d = 4:\n";
  print_indented(results.at(0));
  check(g.nodes.size() == 7 && g.vars().size() == 4, "symbolic graph has 4 vars and 3 adds");
  check(results.size() == 1 && value_of(results[0]) == 10, "graph::run gives [10]");

  // ---- (c) constants fold -----------------------------------------------------
  std::cout << "\n(c) constant inputs: graph::optimize folds the graph\n";
  Symbol folded_out = fancy_func(sym::constant(1), sym::constant(2), sym::constant(3), sym::constant(4));
  graph::Graph before = graph::trace({folded_out});
  graph::Graph after = graph::optimize(before);
  std::cout << "  fancy_func(sym::constant(1), ..., sym::constant(4)), traced:\n";
  print_indented(before);
  std::cout << "  graph::optimize (constant folding, then dead-code elimination):\n";
  print_indented(after);
  check(before.nodes.size() == 7, "unoptimised constant graph has 7 nodes");
  check(after.nodes.size() == 1 && after.nodes[0].op == "const" && value_of(after.nodes[0].value) == 10,
        "optimised graph is the single constant 10");
  check(value_of(graph::run(after, {}).at(0)) == 10 && value_of(graph::run(before, {}).at(0)) == 10,
        "both graphs run to 10");

  if (smoke || !ok) std::printf("\n%s\n", ok ? "all checks passed" : "SOME CHECKS FAILED");
  return ok ? 0 : 1;
}
