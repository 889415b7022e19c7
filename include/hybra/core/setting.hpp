#pragma once
// A setting read from the environment: one of a few spellings, each naming a
// choice, or a ValueError that names the variable and lists the spellings.
#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>

#include "error.hpp"

namespace hybra {

template <class Choice>
struct Spelling {
  std::string_view text;
  Choice choice;
};

// `value` as one of `spellings`; an empty value (the variable unset) is the
// first spelling's choice. `part` names what the setting sets, for the error.
template <class Choice>
Choice parse_setting(std::string_view part, std::string_view variable, std::string_view value,
                     std::initializer_list<Spelling<Choice>> spellings) {
  if (value.empty()) return spellings.begin()->choice;
  std::string listed;
  std::size_t i = 0;
  for (const Spelling<Choice>& s : spellings) {
    if (s.text == value) return s.choice;
    if (i > 0) listed += i + 1 == spellings.size() ? " or " : ", ";
    listed += s.text;
    ++i;
  }
  fail<ValueError>(part, ": ", variable, "=", value, " is not a setting; use ", listed);
}

}  // namespace hybra
