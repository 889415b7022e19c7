#pragma once
// Forms a kernel derives from a storage's bytes (oneDNN's blocked copy of a
// convolution's weights), kept with the storage so that a later call that
// finds the bytes unchanged skips deriving them again.
//
// A form is valid while its storage's engine var counts no write since the
// form was made (engine::Var::writes). The count sees every write hybra
// makes, so a form is never stale unless the bytes were written where hybra
// cannot see: in a user's buffer (from_blob) or through a pointer that
// Tensor::data<T> handed out. Such storages are `untracked` and keep no form:
// the kernel derives it on every call, as it would without this cache.
//
// Derived forms cost memory beside the bytes (a weight's blocked copy is as
// large as the weight). A storage keeps one form per kind and match; a form
// whose bytes changed is replaced, not added to.
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace hybra {

class DerivedForms {
 public:
  // The form of type Form for which matches(form) holds, made at `writes`
  // (the var's current count), or made now by make() (a shared_ptr<Form>).
  // Entries of other types are skipped. Concurrent readers of one storage
  // serialise here; make() runs under the lock, once.
  template <class Form, class Matches, class Make>
  std::shared_ptr<const Form> get(std::uint64_t writes, Matches&& matches, Make&& make) {
    std::lock_guard lock(mutex_);
    for (Entry& e : entries_) {
      if (e.kind != &kind_of<Form> || !matches(*static_cast<const Form*>(e.form.get()))) continue;
      if (e.writes != writes) {
        e.form = std::shared_ptr<const Form>(make());
        e.writes = writes;
      }
      return std::static_pointer_cast<const Form>(e.form);
    }
    std::shared_ptr<const Form> form(make());
    entries_.push_back({&kind_of<Form>, writes, form});
    return form;
  }

 private:
  // One address per Form type: the entry's type, without RTTI (a variable,
  // so that no linker folds two of them into one).
  template <class Form>
  static inline char kind_of = 0;

  struct Entry {
    const char* kind;
    std::uint64_t writes;
    std::shared_ptr<const void> form;
  };
  std::mutex mutex_;
  std::vector<Entry> entries_;
};

}  // namespace hybra
