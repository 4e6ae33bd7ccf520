#include "scalesweep/io/tensor_order.h"

#include "scalesweep/io/file.h"  // IoError

namespace scalesweep::io {

void TensorWriteOrder::declare(std::string name, uint64_t nbytes) {
  decls_.push_back({std::move(name), nbytes});
}

void TensorWriteOrder::check_whole(const std::string& where, std::string_view name,
                                   uint64_t n) const {
  if (next_ < decls_.size() && part_ == 0 && decls_[next_].name == name &&
      n != decls_[next_].nbytes)
    throw IoError(where + ": tensor '" + decls_[next_].name + "' has " + std::to_string(n) +
                  " bytes, declared " + std::to_string(decls_[next_].nbytes));
}

bool TensorWriteOrder::add_part(const std::string& where, std::string_view name, uint64_t n) {
  if (next_ >= decls_.size())
    throw IoError(where + ": tensor '" + std::string(name) + "' was not declared");
  const Decl& d = decls_[next_];
  if (d.name != name)
    throw IoError(where + ": tensor '" + std::string(name) + "' written out of order (expected '" +
                  d.name + "', tensor " + std::to_string(next_) + ")");
  if (n > d.nbytes - part_)
    throw IoError(where + ": tensor '" + d.name + "' has " + std::to_string(part_ + n) +
                  " bytes or more, declared " + std::to_string(d.nbytes));
  part_ += n;
  if (part_ < d.nbytes) return false;
  part_ = 0;
  ++next_;
  return true;
}

void TensorWriteOrder::check_complete(const std::string& where) const {
  if (next_ == decls_.size()) return;
  const Decl& d = decls_[next_];
  throw IoError(
      where + ": tensor '" + d.name + "' (tensor " + std::to_string(next_) + ") was not written" +
      (part_ > 0
           ? " whole (" + std::to_string(part_) + " of " + std::to_string(d.nbytes) + " bytes)"
           : std::string()));
}

}  // namespace scalesweep::io
