// One name table per enum, declared beside the enum it names. The CLI, the Python module, JSON
// output and error messages all read names through it, so a value has one spelling everywhere
// and an unknown name gets one message. Layer `base`: no dependencies.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace scalesweep {

template <class E>
struct Named {
  E value;
  std::string_view name;
};

// The first entry of a value holds its canonical name (what name() returns and accepted()
// lists); later entries with the same value are aliases that parse() also accepts.
template <class E, size_t N>
class NameTable {
 public:
  constexpr NameTable(std::string_view what, const Named<E> (&entries)[N], bool ignore_case)
      : what_(what), ignore_case_(ignore_case) {
    for (size_t i = 0; i < N; ++i) entries_[i] = entries[i];
  }

  // What the names name ("method", "format"), as error messages say it.
  constexpr std::string_view what() const { return what_; }

  // Canonical name; a value missing from the table is a programming error.
  std::string_view name(E e) const {
    for (const auto& n : entries_)
      if (n.value == e) return n.name;
    throw std::logic_error(std::string(what_) + " " + std::to_string(static_cast<long long>(e)) +
                           " has no name");
  }

  std::optional<E> find(std::string_view s) const {
    for (const auto& n : entries_)
      if (equal(n.name, s)) return n.value;
    return std::nullopt;
  }

  // Throws std::invalid_argument "unknown <what> '<s>' (accepted: a, b, c)".
  E parse(std::string_view s) const {
    if (auto e = find(s)) return *e;
    throw std::invalid_argument("unknown " + std::string(what_) + " '" + std::string(s) +
                                "' (accepted: " + accepted() + ")");
  }

  // Canonical names in table order, joined with sep.
  std::string accepted(std::string_view sep = ", ") const {
    std::string out;
    for (E e : values()) {
      if (!out.empty()) out += sep;
      out += name(e);
    }
    return out;
  }

  // Each value once, in table order.
  std::vector<E> values() const {
    std::vector<E> out;
    for (size_t i = 0; i < N; ++i) {
      bool seen = false;
      for (size_t j = 0; j < i; ++j) seen = seen || entries_[j].value == entries_[i].value;
      if (!seen) out.push_back(entries_[i].value);
    }
    return out;
  }

 private:
  bool equal(std::string_view a, std::string_view b) const {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      char x = a[i], y = b[i];
      if (ignore_case_) {
        if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
        if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
      }
      if (x != y) return false;
    }
    return true;
  }

  std::string_view what_;
  bool ignore_case_;
  std::array<Named<E>, N> entries_{};
};

// make_names<Method>("method", {{Method::kAbsMax, "absmax"}, ...}): N is deduced.
template <class E, size_t N>
constexpr NameTable<E, N> make_names(std::string_view what, const Named<E> (&entries)[N],
                                     bool ignore_case = false) {
  return NameTable<E, N>(what, entries, ignore_case);
}

}  // namespace scalesweep
