// Exact rational numbers over 128-bit integers for the bounds derivation (docs/BOUNDS.md).
//
// A Rat is always normalized: gcd(num, den) = 1 and den > 0. Every operation checks for
// overflow and throws RatOverflow instead of wrapping, so a result is either exact or an
// exception (the derivation treats an overflowing certificate as "not proven", never as
// proven). Header-only, no dependencies.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace scalesweep::bounds {

struct RatOverflow : std::overflow_error {
  RatOverflow() : std::overflow_error("rational arithmetic overflow (128-bit)") {}
};

class Rat {
 public:
  using I = __int128;

  constexpr Rat() = default;
  constexpr Rat(long long n) : n_(n), d_(1) {}  // NOLINT: implicit from integers is intended
  Rat(I n, I d) : n_(n), d_(d) {
    if (d == 0) throw std::domain_error("Rat: zero denominator");
    normalize();
  }
  static Rat frac(long long n, long long d) { return Rat(I{n}, I{d}); }
  // 2^k for |k| <= 125.
  static Rat pow2(int k) {
    if (k > 125 || k < -125) throw RatOverflow();
    return k >= 0 ? Rat(I{1} << k, I{1}) : Rat(I{1}, I{1} << (-k));
  }

  I num() const { return n_; }
  I den() const { return d_; }
  int sign() const { return n_ > 0 ? 1 : (n_ < 0 ? -1 : 0); }
  bool is_zero() const { return n_ == 0; }
  double to_double() const { return static_cast<double>(n_) / static_cast<double>(d_); }
  long double to_long_double() const {
    return static_cast<long double>(n_) / static_cast<long double>(d_);
  }

  friend Rat operator+(const Rat& a, const Rat& b) {
    if (a.d_ == b.d_) return Rat(add(a.n_, b.n_), a.d_);
    const I g = gcd(a.d_, b.d_);
    const I da = a.d_ / g, db = b.d_ / g;
    return Rat(add(mul(a.n_, db), mul(b.n_, da)), mul(a.d_, db));
  }
  friend Rat operator-(const Rat& a) {
    if (a.n_ == min_i()) throw RatOverflow();
    Rat r;
    r.n_ = -a.n_;
    r.d_ = a.d_;
    return r;
  }
  friend Rat operator-(const Rat& a, const Rat& b) { return a + (-b); }
  friend Rat operator*(const Rat& a, const Rat& b) {
    if (a.n_ == 0 || b.n_ == 0) return Rat();
    // Cross-reduce first so the products stay as small as possible.
    const I g1 = gcd(abs_i(a.n_), b.d_), g2 = gcd(abs_i(b.n_), a.d_);
    return Rat(mul(a.n_ / g1, b.n_ / g2), mul(a.d_ / g2, b.d_ / g1));
  }
  friend Rat operator/(const Rat& a, const Rat& b) {
    if (b.n_ == 0) throw std::domain_error("Rat: division by zero");
    Rat inv;
    inv.n_ = b.n_ < 0 ? -b.d_ : b.d_;
    inv.d_ = abs_i(b.n_);
    return a * inv;
  }
  Rat& operator+=(const Rat& o) { return *this = *this + o; }
  Rat& operator-=(const Rat& o) { return *this = *this - o; }
  Rat& operator*=(const Rat& o) { return *this = *this * o; }
  Rat& operator/=(const Rat& o) { return *this = *this / o; }

  // Exact comparison (the sign of a - b, computed without overflow where possible).
  friend int cmp(const Rat& a, const Rat& b) {
    if (a.d_ == b.d_) return a.n_ < b.n_ ? -1 : (a.n_ > b.n_ ? 1 : 0);
    const int sa = a.sign(), sb = b.sign();
    if (sa != sb) return sa < sb ? -1 : 1;
    return (a - b).sign();
  }
  friend bool operator==(const Rat& a, const Rat& b) { return a.n_ == b.n_ && a.d_ == b.d_; }
  friend bool operator!=(const Rat& a, const Rat& b) { return !(a == b); }
  friend bool operator<(const Rat& a, const Rat& b) { return cmp(a, b) < 0; }
  friend bool operator>(const Rat& a, const Rat& b) { return cmp(a, b) > 0; }
  friend bool operator<=(const Rat& a, const Rat& b) { return cmp(a, b) <= 0; }
  friend bool operator>=(const Rat& a, const Rat& b) { return cmp(a, b) >= 0; }

  // floor(a) as an integer (throws if it does not fit in 64 bits).
  long long floor_int() const {
    I q = n_ / d_;
    if ((n_ % d_ != 0) && n_ < 0) --q;
    if (q > I{INT64_MAX} || q < I{INT64_MIN}) throw RatOverflow();
    return static_cast<long long>(q);
  }

  // "n/d", or "n" for integers.
  std::string str() const {
    std::string s = i128_str(n_);
    if (d_ != 1) {
      s.push_back('/');
      s.append(i128_str(d_));
    }
    return s;
  }

  static std::string i128_str(I v) {
    if (v == 0) return std::string("0");
    char buf[48];
    int pos = 48;
    const bool neg = v < 0;
    // Work with the negative value so that INT128_MIN prints too.
    I x = neg ? v : -v;
    while (x != 0) {
      buf[--pos] = static_cast<char>('0' - static_cast<int>(x % 10));
      x /= 10;
    }
    if (neg) buf[--pos] = '-';
    return std::string(buf + pos, static_cast<size_t>(48 - pos));
  }

 private:
  static constexpr I min_i() { return -(((I{1} << 126) - 1) * 2 + 1) - 1; }
  static I abs_i(I v) {
    if (v == min_i()) throw RatOverflow();
    return v < 0 ? -v : v;
  }
  static I gcd(I a, I b) {
    a = abs_i(a);
    b = abs_i(b);
    while (b != 0) {
      const I t = a % b;
      a = b;
      b = t;
    }
    return a;
  }
  static I add(I a, I b) {
    I r;
    if (__builtin_add_overflow(a, b, &r)) throw RatOverflow();
    return r;
  }
  static I mul(I a, I b) {
    I r;
    if (__builtin_mul_overflow(a, b, &r)) throw RatOverflow();
    return r;
  }
  void normalize() {
    if (d_ < 0) {
      if (d_ == min_i() || n_ == min_i()) throw RatOverflow();
      d_ = -d_;
      n_ = -n_;
    }
    if (n_ == 0) {
      d_ = 1;
      return;
    }
    const I g = gcd(n_, d_);
    if (g != 1) {
      n_ /= g;
      d_ /= g;
    }
  }

  I n_ = 0, d_ = 1;
};

inline Rat abs(const Rat& a) { return a.sign() < 0 ? -a : a; }
inline const Rat& max(const Rat& a, const Rat& b) { return a < b ? b : a; }
inline const Rat& min(const Rat& a, const Rat& b) { return b < a ? b : a; }

}  // namespace scalesweep::bounds
