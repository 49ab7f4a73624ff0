/*
 * vecmath.h: exp, expm1, log, pow, tanh, sigmoid, erf, erfc and the normal
 * CDF in float and double, and float sin, cos, tan, asin, acos, atan, sinh,
 * cosh, asinh, acosh and atanh (evaluated in double), for the built-in
 * elementwise kernels.
 *
 * Each function is a plain inline scalar function without branches or libm
 * calls: range reduction and polynomials, with selects where a branch would
 * be.  A loop over an array of them (VecExp, VecTanh, ... below) is therefore
 * vectorized by g++ -O3 at whatever width the kernel variant is compiled for
 * (-mavx2 -mfma, -mavx512f; SSE2 without flags).
 *
 * Rules the code keeps, so that every variant gives the same answer on the
 * scalar tail as in the vector body, whatever the array is split into:
 *  - kernels are compiled with -ffp-contract=off; fused multiply-adds are
 *    explicit (Fma: one rounding where the ISA has FMA, two where not);
 *  - no -ffast-math: the rounding and the NaN behaviour written here is what
 *    runs.
 *
 * Special values follow NumPy: NaN in gives NaN out, exp(-inf) = 0,
 * exp(inf) = inf, overflow gives inf and underflow gradually reaches 0
 * through the subnormals, tanh/erf keep the sign of -0.0, and subnormal
 * inputs are computed, not flushed.  Accuracy, measured against float64 (for
 * float) and long double / mpmath (for double) references, is stated in each
 * op's doc string and in docs/benchmarks.md, and tests/test_kernel_accuracy.py
 * asserts it.
 *
 * The polynomial coefficients of erf and log were fitted for opforge
 * (Chebyshev fits at 50 digits, rounded to the element type), and so were
 * those of the float trigonometric and hyperbolic functions (see their
 * section); the others are Taylor series.
 */
#ifndef OPFORGE_BUILTINS_VECMATH_H_
#define OPFORGE_BUILTINS_VECMATH_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace vecmath {

// For the larger functions: a loop that calls one out of line is not vectorized,
// and g++ stops inlining them where a kernel has several such loops.
#define VECMATH_INLINE inline __attribute__((always_inline))

// ---------------------------------------------------------------------------
// Per-type constants and bit access.

template <typename T>
struct Traits;

template <>
struct Traits<float> {
  typedef int32_t Int;
  static constexpr int kMantissa = 23;
  static constexpr Int kBias = 127;
  static constexpr float kShift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low bits
  static constexpr float kExpHi = 89.0f;        // exp(89) > FLT_MAX: inf
  static constexpr float kExpLo = -104.0f;      // exp(-104) < half the smallest subnormal: 0
  static constexpr float kExpM1Lo = -40.0f;     // expm1 below this is -1 in float
  static constexpr float kLn2Hi = 0.693359375f;  // few bits: n * kLn2Hi is exact for every n used
  static constexpr float kLn2Lo = -2.12194440e-4f;
  static constexpr float kSplit = 4097.0f;      // 2^12 + 1, Dekker's split
  static constexpr float kErfcClamp = 12.0f;    // erfc(12) underflows to 0 in float
  static constexpr float kPhiClamp = 20.0f;     // Phi(-20) underflows to 0 in float
  static constexpr float kMinNormal = 1.17549435e-38f;
  static constexpr float kSubnormalScale = 33554432.0f;  // 2^25: brings a subnormal into the normals
  static constexpr int kSubnormalBits = 25;
  static constexpr float kIntLimit = 8388608.0f;  // 2^23: from here on every value is an integer
};

template <>
struct Traits<double> {
  typedef int64_t Int;
  static constexpr int kMantissa = 52;
  static constexpr Int kBias = 1023;
  static constexpr double kShift = 6755399441055744.0;  // 1.5 * 2^52
  static constexpr double kExpHi = 710.0;
  static constexpr double kExpLo = -746.0;
  static constexpr double kExpM1Lo = -80.0;
  static constexpr double kLn2Hi = 6.93147180369123816490e-01;  // low 32 bits zero
  static constexpr double kLn2Lo = 1.90821492927058770002e-10;
  static constexpr double kSplit = 134217729.0;  // 2^27 + 1
  static constexpr double kErfcClamp = 28.0;
  static constexpr double kPhiClamp = 40.0;
  static constexpr double kMinNormal = 2.2250738585072014e-308;
  static constexpr double kSubnormalScale = 18014398509481984.0;  // 2^54
  static constexpr int kSubnormalBits = 54;
  static constexpr double kIntLimit = 4503599627370496.0;  // 2^52
};

template <typename T>
inline typename Traits<T>::Int Bits(T v) {
  typename Traits<T>::Int i;
  std::memcpy(&i, &v, sizeof v);
  return i;
}

template <typename T>
inline T FromBits(typename Traits<T>::Int i) {
  T v;
  std::memcpy(&v, &i, sizeof v);
  return v;
}

inline float Fma(float a, float b, float c) {
#ifdef __FMA__
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

inline double Fma(double a, double b, double c) {
#ifdef __FMA__
  return __builtin_fma(a, b, c);
#else
  return a * b + c;
#endif
}

template <typename T>
inline T Abs(T v) {
  typedef typename Traits<T>::Int Int;
  const Int sign = Int(1) << (sizeof(T) * 8 - 1);
  return FromBits<T>(Bits(v) & ~sign);
}

// |magnitude| with the sign bit of `sign` (NaN and -0.0 included).
template <typename T>
inline T CopySign(T magnitude, T sign) {
  typedef typename Traits<T>::Int Int;
  const Int bit = Int(1) << (sizeof(T) * 8 - 1);
  return FromBits<T>((Bits(magnitude) & ~bit) | (Bits(sign) & bit));
}

// Clamps that let NaN through (comparisons with NaN are false).
template <typename T>
inline T AtLeast(T v, T lo) { return v < lo ? lo : v; }
template <typename T>
inline T AtMost(T v, T hi) { return v > hi ? hi : v; }

// 2^n for n in the normal exponent range.
template <typename T>
inline T Pow2(typename Traits<T>::Int n) {
  typedef typename Traits<T>::Int Int;
  typedef typename std::make_unsigned<Int>::type Unsigned;  // (a NaN's garbage n shifts without UB)
  return FromBits<T>(Int(Unsigned(n + Traits<T>::kBias) << Traits<T>::kMantissa));
}

// c0 z^k + c1 z^(k-1) + ... + ck by Horner's rule, written out at compile
// time (a loop over a coefficient table may stay a loop and block vectorization).
template <typename T>
inline T Horner(T, T c) { return c; }
template <typename T, typename... Rest>
inline T Horner(T z, T c0, T c1, Rest... rest) { return Horner(z, Fma(c0, z, c1), T(rest)...); }

// hi + lo = v * v exactly (hi the rounded square).
template <typename T>
inline void Square(T v, T &hi, T &lo) {
  hi = v * v;
#ifdef __FMA__
  lo = Fma(v, v, -hi);
#else
  const T c = Traits<T>::kSplit * v;
  const T vh = c - (c - v), vl = v - vh;
  lo = ((vh * vh - hi) + T(2) * vh * vl) + vl * vl;
#endif
}

// hi + lo = a * b exactly (hi the rounded product).
template <typename T>
inline void Product(T a, T b, T &hi, T &lo) {
  hi = a * b;
#ifdef __FMA__
  lo = Fma(a, b, -hi);
#else
  const T ca = Traits<T>::kSplit * a, cb = Traits<T>::kSplit * b;
  const T ah = ca - (ca - a), al = a - ah, bh = cb - (cb - b), bl = b - bh;
  lo = (((ah * bh - hi) + ah * bl) + al * bh) + al * bl;
#endif
}

// ---------------------------------------------------------------------------
// exp and expm1: x = n ln2 + r, |r| <= ln2 / 2 (a little more without FMA),
// e^r - 1 by its Taylor series (degree 7 for float, 13 for double: the
// truncation is far below half an ulp), e^x = 2^n (1 + (e^r - 1)).

inline float ExpM1Reduced(float r) {
  float p = 1.0f / 5040;
  p = Fma(p, r, 1.0f / 720);
  p = Fma(p, r, 1.0f / 120);
  p = Fma(p, r, 1.0f / 24);
  p = Fma(p, r, 1.0f / 6);
  p = Fma(p, r, 0.5f);
  return Fma(p, r * r, r);
}

inline double ExpM1Reduced(double r) {
  double p = 1.0 / 6227020800.0;
  p = Fma(p, r, 1.0 / 479001600.0);
  p = Fma(p, r, 1.0 / 39916800.0);
  p = Fma(p, r, 1.0 / 3628800.0);
  p = Fma(p, r, 1.0 / 362880.0);
  p = Fma(p, r, 1.0 / 40320.0);
  p = Fma(p, r, 1.0 / 5040.0);
  p = Fma(p, r, 1.0 / 720.0);
  p = Fma(p, r, 1.0 / 120.0);
  p = Fma(p, r, 1.0 / 24.0);
  p = Fma(p, r, 1.0 / 6.0);
  p = Fma(p, r, 0.5);
  return Fma(p, r * r, r);
}

// n (as a float and as an integer) and r for x already clamped.
template <typename T>
inline T Reduce(T x, typename Traits<T>::Int &n) {
  typedef Traits<T> K;
  const T t = Fma(x, T(1.4426950408889634), K::kShift);  // x / ln2 rounded, in t's low bits
  n = Bits(t) - Bits(K::kShift);
  const T nf = t - K::kShift;
  const T r = Fma(nf, -K::kLn2Hi, x);
  return Fma(nf, -K::kLn2Lo, r);
}

// e^x as 2^n (1 + q), for x clamped to where e^x is neither 0 nor inf.
template <typename T>
struct ExpParts {
  T q;
  typename Traits<T>::Int n;
  explicit ExpParts(T x) {
    typedef Traits<T> K;
    q = ExpM1Reduced(Reduce(AtMost(AtLeast(x, K::kExpLo), K::kExpHi), n));
  }
  // e^(hi + lo), |lo| at most half an ulp of hi: lo joins the reduced argument.
  ExpParts(T hi, T lo) {
    typedef Traits<T> K;
    const T c = AtMost(AtLeast(hi, K::kExpLo), K::kExpHi);
    q = ExpM1Reduced(Reduce(c, n) + (c == hi ? lo : T(0)));  // (lo means nothing once hi is clamped)
  }
  // m e^x, with m of moderate size: m (1 + q) is rounded while still normal,
  // then scaled by 2^n in two factors (each normal even where 2^n is not), so
  // a subnormal result is rounded once, in the last multiplication.
  T Times(T m) const {
    const typename Traits<T>::Int half = n >> 1;
    return Fma(m, q, m) * Pow2<T>(half) * Pow2<T>(n - half);
  }
};

template <typename T>
inline T ExpTimes(T x, T m) { return ExpParts<T>(x).Times(m); }

template <typename T>
inline T Exp(T x) { return ExpTimes(x, T(1)); }

// e^x - 1 for x in [kExpM1Lo, 0] (what tanh needs): exact where n = 0, and
// s q + (s - 1) keeps the relative error small where n != 0.
template <typename T>
inline T ExpM1Negative(T x) {
  typedef Traits<T> K;
  typename K::Int n;
  const T q = ExpM1Reduced(Reduce(AtLeast(x, K::kExpM1Lo), n));
  const T s = Pow2<T>(n);
  return Fma(s, q, s - T(1));
}

// ---------------------------------------------------------------------------
// log: x = 2^k m with m in [sqrt(1/2), sqrt(2)) (subnormals scaled into the
// normals first), f = m - 1 exact, log x = k ln2 + log1p(f).  float:
// log1p(f) = f + f^2 Q(f), Q fitted on f's range; double: with s = f / (2 + f),
// log1p(f) = f - f^2/2 + s (f^2/2 + z P(z)), z = s^2 (the f^2/2 terms cancel
// exactly in value and leave the result's main part f exact).

// k (as a T holding an integer) and m for x > 0 finite (Subnormal false: x is a normal number).
template <bool Subnormal = true, typename T>
VECMATH_INLINE T LogReduce(T x, T &m) {
  typedef Traits<T> K;
  typedef typename K::Int Int;
  typedef typename std::make_unsigned<Int>::type Unsigned;
  const bool tiny = Subnormal && x < K::kMinNormal;
  const Unsigned bits = Unsigned(Bits(tiny ? x * K::kSubnormalScale : x));
  const Unsigned mask = (Unsigned(1) << K::kMantissa) - 1;
  const Unsigned half_root = Unsigned(Bits(T(0.70710678118654752440)));  // sqrt(1/2)
  // Subtracting sqrt(2)'s mantissa moves the exponent up by one exactly where m >= sqrt(2).
  const Unsigned shifted = bits - (half_root & mask);
  m = FromBits<T>(Int((shifted & mask) + half_root));
  // The biased exponent (0 .. 2^(bits - mantissa)) as a T without an int-to-float
  // conversion (none for 64-bit lanes below AVX-512): OR it into 1.5 * 2^mantissa.
  const T e = FromBits<T>(Int((shifted >> K::kMantissa) | Unsigned(Bits(K::kShift)))) - K::kShift;
  return e - T(K::kBias - 1) - (tiny ? T(K::kSubnormalBits) : T(0));
}

// s (f^2/2 + z P(z)) - f^2/2, the correction to f.
inline double Log1pTail(double f) {
  const double s = f / (2.0 + f), z = s * s, half_square = 0.5 * f * f;
  const double p = Horner(z, 0.14616449685043406, 0.15331721600556042, 0.18182889125261723, 0.2222221113479508,
                          0.28571428625975487, 0.39999999999899505, 0.666666666666667);
  return Fma(s, Fma(z, p, half_square), -half_square);
}

template <typename T>
inline T LogFinish(T x, T r) {  // the special values: log(+-0) = -inf, log(< 0) = NaN, inf and NaN as they are
  const T inf = std::numeric_limits<T>::infinity();
  r = x == inf ? x : r;
  r = x == T(0) ? -inf : r;
  return x < T(0) ? std::numeric_limits<T>::quiet_NaN() : (x != x ? x : r);
}

// Special false: x is a positive, finite, normal number (VecLog's blocks without special values).
template <bool Special = true>
VECMATH_INLINE float Log(float x) {
  float m;
  const float k = LogReduce<Special>(x, m);
  const float f = m - 1.0f;
  const float q = Horner(f, -0.07673641f, 0.12722673f, -0.13127555f, 0.14204855f, -0.16626646f, 0.20001234f,
                         -0.2500078f, 0.3333333f, -0.49999997f);
  // k ln2_lo joins the small terms, k ln2_hi (exact) comes last
  const float r = Fma(k, Traits<float>::kLn2Hi, f + Fma(f * f, q, k * Traits<float>::kLn2Lo));
  return Special ? LogFinish(x, r) : r;
}

template <bool Special = true>
VECMATH_INLINE double Log(double x) {
  double m;
  const double k = LogReduce<Special>(x, m);
  const double f = m - 1.0;
  const double r = Fma(k, Traits<double>::kLn2Hi, f + Fma(k, Traits<double>::kLn2Lo, Log1pTail(f)));
  return Special ? LogFinish(x, r) : r;
}

// y[i] = Log(x[i]) for i < n (y may be x).  Zeros, subnormals, negatives, inf and NaN cost Log a third of
// its time, so each block of elements looks for one first (one max reduction: x's bits less the smallest
// normal's, as unsigned, wrap past inf's for all of them) and the blocks without (nearly all) skip them;
// results are Log's either way.
template <typename T>
inline void VecLog(const T *x, T *y, int64_t n) {
  typedef typename std::make_unsigned<typename Traits<T>::Int>::type Unsigned;
  const Unsigned normal = Unsigned(Bits(Traits<T>::kMinNormal));
  const Unsigned span = Unsigned(Bits(std::numeric_limits<T>::infinity())) - normal;
  constexpr int64_t kBlock = 256;
  for (int64_t lo = 0; lo < n; lo += kBlock) {
    const int64_t hi = lo + kBlock < n ? lo + kBlock : n;
    Unsigned worst = 0;
    for (int64_t i = lo; i < hi; i++) {
      const Unsigned u = Unsigned(Bits(x[i])) - normal;
      worst = u > worst ? u : worst;
    }
    if (worst >= span) {
      for (int64_t i = lo; i < hi; i++) y[i] = Log<true>(x[i]);
    } else {
      for (int64_t i = lo; i < hi; i++) y[i] = Log<false>(x[i]);
    }
  }
}

// ---------------------------------------------------------------------------
// pow(a, b) = e^(b log|a|) with a's sign for odd integer b.  A rounding error
// e in b log|a| is an error e relative to the result, and |b log|a|| reaches
// 745, so log|a| must be far more precise than the element type:
//  - float: 2^(b log2|a|) in double, each side as short as the precision
//    needed allows (see Log2Wide and Exp2Wide: b log2|a| then carries below
//    2^-30 of error where the result is neither 0 nor inf);
//  - double: log|a| in double-double (relative error below 2^-66), from
//    t = (m - 1) / (m + 1), log m = 2t + t^3 (2/3 + w T(w)), w = t^2, and
//    b log|a| as a double-double product fed to exp as hi + lo.

// log x as hi + lo for x > 0 finite.
VECMATH_INLINE void LogExtended(double x, double &hi, double &lo) {
  typedef Traits<double> K;
  double m;
  const double k = LogReduce(x, m);
  const double num = m - 1.0;                              // exact
  const double den = m + 1.0, den_lo = m - (den - 1.0);    // m + 1 = den + den_lo exactly
  const double th = num / den;                             // t = th + tl
  double ph, pl;
  Product(th, den, ph, pl);
  const double tl = (((num - ph) - pl) - th * den_lo) / den;
  double wh, wl, ch, cl;                                   // t^2, t^3
  Product(th, th, wh, wl);
  wl += 2.0 * th * tl;
  Product(th, wh, ch, cl);
  cl += th * wl + tl * wh;
  const double tail = wh * Horner(wh, 0.1291349606680315, 0.13285967273890614, 0.1538557450045883,
                                  0.18181808251607398, 0.2222222227107745, 0.2857142857133856,
                                  0.40000000000000024);
  const double two_thirds = 0.6666666666666666, two_thirds_lo = 3.700743415417188e-17;
  const double sh = two_thirds + tail, sl = ((two_thirds - sh) + tail) + two_thirds_lo;
  double bh, bl;                                           // t^3 (2/3 + w T(w))
  Product(ch, sh, bh, bl);
  bl += ch * sl + cl * sh;
  const double uh = 2.0 * th + bh, ul = ((2.0 * th - uh) + bh) + (2.0 * tl + bl);  // log m
  const double kh = k * K::kLn2Hi;                         // exact; |kh| > |uh| unless k = 0
  hi = kh + uh;
  lo = ((kh - hi) + uh) + (ul + k * K::kLn2Lo);
}

// pow from mag = |a|^b computed for 0 < |a| < inf (mag's value elsewhere is
// ignored): zeros, infinities, NaN and negative bases as C99 and NumPy have
// them.  Conditions are two-way selects one after another: g++ if-converts
// (and so vectorizes) neither nested selects that merge many values nor ands
// of comparisons of mixed widths.
template <typename T>
VECMATH_INLINE T PowFinish(T a, T b, T mag) {
  typedef Traits<T> K;
  typedef typename K::Int Int;
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  const T x = Abs(a), e = Abs(b), limit = K::kIntLimit;
  const T toward_zero = b < T(0) ? inf : T(0);  // |a|^b as |a| -> 0 (and for |a| < 1, b = +-inf)
  const T toward_inf = b < T(0) ? T(0) : inf;   // as |a| -> inf (and for |a| > 1, b = +-inf)
  T extreme = x < T(1) ? toward_zero : toward_inf;
  extreme = x == T(1) ? T(1) : extreme;
  mag = e == inf ? extreme : mag;
  mag = x == T(0) ? toward_zero : mag;
  mag = x == inf ? toward_inf : mag;
  // b's parity: below limit, e + limit holds e rounded to an integer in its low
  // mantissa bits (and equals e + limit exactly where e is one); from limit to
  // 2 limit the ulp is 1; above, every value is even.
  const T t = e + limit;
  const Int bits_t = Bits(t), bits_e = Bits(e);
  Int low = e < T(2) * limit ? bits_e : Int(0);
  low = e < limit ? bits_t : low;
  const T fraction = t - limit == e ? T(0) : nan;  // NaN where b is not an integer
  T not_integer = e == e ? T(0) : nan;
  not_integer = e < limit ? fraction : not_integer;
  // a negative (-0.0 included) and b odd: the sign flips
  const Int sign = Int(1) << (sizeof(T) * 8 - 1);
  T r = FromBits<T>(Bits(mag) ^ (Bits(a) & sign & -(low & 1)));
  // a finite negative base needs an integer b (subtracting 0 keeps -0.0, adding would not)
  const T finite_negative = a > -inf ? r - not_integer : r;
  r = a < T(0) ? finite_negative : r;
  r = b != b ? b : r;
  r = a != a ? a : r;
  r = b == T(0) ? T(1) : r;
  return a == T(1) ? T(1) : r;
}

// log2 x in double for a float x > 0 finite (other x give a finite or NaN
// value, never UB): x = 2^k m, m in [sqrt(1/2), sqrt(2)) from x's bits (a
// subnormal x scaled into the normals first), f = m - 1 and s = f / (2 + f)
// exact but for the division's rounding, log2 m = s P(s^2) with P fitted on
// s's range (relative error 2^-37.8, no table: gathers cost more than the
// division on the CPUs this runs on).
VECMATH_INLINE double Log2Wide(float x) {
  const bool tiny = x < Traits<float>::kMinNormal;
  const int32_t bits = Bits(x * (tiny ? 8388608.0f : 1.0f));  // (x 2^23: a product, not a select of two values)
  const int32_t shifted = bits - 0x3f3504f3;                    // sqrt(1/2)'s bits
  const double m = double(FromBits<float>(bits - (shifted & int32_t(0xff800000))));
  const double k = double((shifted >> 23) - (tiny ? 23 : 0));
  const double f = m - 1.0, s = f / (2.0 + f);
  return k + s * Horner(s * s, 0.3407251983335025, 0.411672992266064, 0.5770835802285016, 0.9617966733679494,
                        2.8853900817900637);
}

// 2^y in double for y where a float result is neither 0 nor inf (clamped
// beyond: 2^-160 rounds to 0 in float, 2^130 to inf): y = n + r, |r| <= 1/2
// exact, 2^r - 1 = r Q(r) with Q fitted on [-1/2, 1/2] (relative error
// 2^-33), 2^n from its bits (every n here is a normal double's exponent).
VECMATH_INLINE double Exp2Wide(double y) {
  y = y < 130.0 ? y : 130.0;  // (as written, min and max instructions; a NaN y is PowFinish's to replace)
  y = y > -160.0 ? y : -160.0;
  const double t = y + Traits<double>::kShift;
  const int64_t n = Bits(t) - Bits(Traits<double>::kShift);
  const double r = y - (t - Traits<double>::kShift);
  const double q = r * Horner(r, 1.5303702451919612e-05, 0.00015461447461298118, 0.0013333478467158547,
                              0.009618056669891503, 0.05550410906331985, 0.24022650922342711, 0.6931471805568316);
  const double scale = Pow2<double>(n);
  return Fma(scale, q, scale);
}

// |a|^b for 0 < |a| < inf and b finite, where it is PowFinish's answer as it
// stands (b = 0 and a = 1 give exactly 1: log of 1 is exactly 0); elsewhere
// a value PowFinish replaces.
VECMATH_INLINE float PowMagnitude(float a, float b) { return float(Exp2Wide(double(b) * Log2Wide(Abs(a)))); }

VECMATH_INLINE double PowMagnitude(double a, double b) {
  const double x = Abs(a);
  double safe = x < std::numeric_limits<double>::infinity() ? x : 1.0;
  safe = x > 0.0 ? safe : 1.0;
  double lh, ll, yh, yl;
  LogExtended(safe, lh, ll);
  Product(b, lh, yh, yl);
  yl += b * ll;
  return ExpParts<double>(yh, yl).Times(1.0);
}

VECMATH_INLINE float Pow(float a, float b) { return PowFinish(a, b, PowMagnitude(a, b)); }
VECMATH_INLINE double Pow(double a, double b) { return PowFinish(a, b, PowMagnitude(a, b)); }


// y[i] = Pow(a[i * ia], b[i * ib]) for i < n, IA and IB the steps when known
// at compile time (0 or 1; -1: ia and ib).  The special values cost PowFinish
// about a third of the time, so each block of elements looks for one first
// and the blocks without (nearly all) skip it; results are Pow's either way.
// y may be a or b.
template <int IA, int IB, typename T>
inline void VecPowSteps(const T *a, int64_t ia, const T *b, int64_t ib, T *y, int64_t n) {
  if (IA >= 0) ia = IA;
  if (IB >= 0) ib = IB;
  typedef typename std::make_unsigned<typename Traits<T>::Int>::type Unsigned;
  const Unsigned inf = Unsigned(Bits(std::numeric_limits<T>::infinity()));
  constexpr int64_t kBlock = 256;
  for (int64_t lo = 0; lo < n; lo += kBlock) {
    const int64_t hi = lo + kBlock < n ? lo + kBlock : n;
    // PowMagnitude stands where 0 < a < inf (a's bits less 1 below inf's less
    // 1, as unsigned) and b is finite (b's bits without the sign below inf's):
    // two max reductions, the cheapest test that vectorizes.
    Unsigned worst_a = 0, worst_b = 0;
    for (int64_t i = lo; i < hi; i++) {
      const Unsigned ua = Unsigned(Bits(a[i * ia])) - 1, ub = Unsigned(Bits(b[i * ib])) << 1;
      worst_a = ua > worst_a ? ua : worst_a;
      worst_b = ub > worst_b ? ub : worst_b;
    }
    if (worst_a >= inf - 1 || worst_b >= inf << 1) {
      for (int64_t i = lo; i < hi; i++) y[i] = Pow(a[i * ia], b[i * ib]);
    } else {
      for (int64_t i = lo; i < hi; i++) y[i] = PowMagnitude(a[i * ia], b[i * ib]);
    }
  }
}

template <typename T>
inline void VecPow(const T *a, int64_t ia, const T *b, int64_t ib, T *y, int64_t n) {
  if (ia == 1 && ib == 1) {
    VecPowSteps<1, 1>(a, ia, b, ib, y, n);
  } else if (ia == 1 && ib == 0) {
    VecPowSteps<1, 0>(a, ia, b, ib, y, n);
  } else if (ia == 0 && ib == 1) {
    VecPowSteps<0, 1>(a, ia, b, ib, y, n);
  } else {
    VecPowSteps<-1, -1>(a, ia, b, ib, y, n);
  }
}

// tanh|x| = -u / (u + 2) with u = expm1(-2|x|) in (-1, 0]: no cancellation
// near 0, exactly 1 once u rounds to -1; the sign is x's.
template <typename T>
inline T Tanh(T x) {
  const T u = ExpM1Negative(T(-2) * Abs(x));
  return CopySign(-u / (u + T(2)), x);
}

// 1 / (1 + e^-x) for x >= 0, e^x / (1 + e^x) below: e = e^-|x| never
// overflows, and the negative side reaches the subnormals accurately.
template <typename T>
inline T Sigmoid(T x) {
  const T e = Exp(-Abs(x));
  return (x >= T(0) ? T(1) : e) / (T(1) + e);
}

// ---------------------------------------------------------------------------
// erf and erfc.  Below kErfSplit: erf(a) = a S(a^2).  Above: erfc(a) =
// e^(-a^2) G(u) / (1 + 2a) with u = (a - 4.75) / (a + 3) in [-1, 1) and G
// smooth (it tends to 2 / sqrt(pi)); e^(-a^2) is taken from the exact square
// hi + lo = a^2 as e^-hi (1 - lo), so large arguments lose nothing there.

constexpr double kErfSplit = 0.875;

inline float ErfSmall(float z) {  // erf(a) / a as a polynomial in z = a^2
  float p = 8.690369e-05f;
  p = Fma(p, z, -8.2145707e-04f);
  p = Fma(p, z, 5.2070487e-03f);
  p = Fma(p, z, -2.6861707e-02f);
  p = Fma(p, z, 1.1283735e-01f);
  p = Fma(p, z, -3.7612635e-01f);
  return Fma(p, z, 1.1283792e+00f);
}

inline double ErfSmall(double z) {
  return Horner(z, 6.627786135071423e-11,
                -1.1712641683192752e-09,
                1.4735405934568758e-08,
                -1.636001974888772e-07,
                1.646179331465805e-06,
                -1.4925638169259221e-05,
                1.2055332664402735e-04,
                -8.548327017905889e-04,
                5.2239776253799495e-03,
                -2.6866170645127092e-02,
                1.1283791670955111e-01,
                -3.7612638903183754e-01,
                1.1283791670955126e+00);
}

inline float ErfcScaled(float u) {  // G(u)
  return Horner(u, 3.4940833e-06f,
                7.900594e-06f,
                -6.831599e-05f,
                4.236321e-05f,
                7.4479054e-04f,
                -3.8468158e-03f,
                1.1060056e-02f,
                -2.1205494e-02f,
                2.39223e-02f,
                6.441631e-03f,
                -1.0990117e-01f,
                1.2211784e+00f);
}

inline double ErfcScaled(double u) {
  return Horner(u, 4.740573851251863e-12,
                3.332583701589025e-11,
                -4.230031397568143e-11,
                -4.3138129235978847e-10,
                1.8875981143907688e-10,
                3.6030775382456568e-09,
                -7.499570657065928e-10,
                -2.7902842998610288e-08,
                9.076117450892447e-09,
                2.2515220988897153e-07,
                -2.013261777852928e-07,
                -1.8535041305405466e-06,
                4.051755343518576e-06,
                1.2396388471433305e-05,
                -6.892721862867964e-05,
                3.7660769382260405e-05,
                7.451036546935653e-04,
                -3.8444597564917453e-03,
                1.1059982996511841e-02,
                -2.1206036718961443e-02,
                2.3922306221676643e-02,
                6.441677111170497e-03,
                -1.0990116791669315e-01,
                1.2211784257075968e+00);
}

// erfc(a) = e^-(hi + lo) ratio for a >= 0, hi + lo = a^2 (a clamped where
// erfc is 0 anyway): ratio = G(u) (1 - lo) / (1 + 2a).
template <typename T>
inline T ErfcRatio(T a, T lo) {
  return ErfcScaled((a - T(4.75)) / (a + T(3))) * (T(1) - lo) / Fma(T(2), a, T(1));
}
template <typename T>
inline T Erf(T x) {
  const T a = Abs(x);
  const T small = a * ErfSmall(a * a);
  const T c = AtMost(a, Traits<T>::kErfcClamp);
  T hi, lo;
  Square(c, hi, lo);
  const T large = T(1) - ExpTimes(-hi, ErfcRatio(c, lo));
  return CopySign(a < T(kErfSplit) ? small : large, x);
}

// m Phi(x), Phi the standard normal CDF erfc(-x / sqrt 2) / 2, without
// cancellation on either side; t^2 = x^2 / 2 comes from x's exact square,
// and m enters before the final scaling (see ExpTimes).
template <typename T>
inline T NormalCdfTimes(T x, T m) {
  const T a = AtMost(Abs(x), Traits<T>::kPhiClamp);
  const T t = a * T(0.70710678118654752440);
  const T erf_t = t * ErfSmall(t * t);
  T hi, lo;
  Square(a, hi, lo);
  const ExpParts<T> e(T(-0.5) * hi);
  const T ratio = ErfcRatio(t, T(0.5) * lo);
  const bool small = t < T(kErfSplit);
  const T upper = T(0.5) * m * (T(1) + (small ? erf_t : T(1) - e.Times(ratio)));
  T lower = small ? T(0.5) * m * (T(1) - erf_t) : e.Times(T(0.5) * m * ratio);
  lower = Abs(x) >= Traits<T>::kPhiClamp ? m * T(0) : lower;  // Phi is 0 there; the clamped e^-t^2 is not
  return x >= T(0) ? upper : lower;  // NaN: both sides are NaN
}

template <typename T>
inline T NormalCdf(T x) { return NormalCdfTimes(x, T(1)); }

// gelu(x) = x Phi(x).
template <typename T>
inline T Gelu(T x) { return NormalCdfTimes(x, x); }

// The tanh form, 0.5 x (1 + tanh(k (x + c x^3))), written as
// x sigmoid(2 k (x + c x^3)): 1 + tanh cancels for negative x, sigmoid does not.
template <typename T>
inline T GeluTanh(T x) {
  const T k2 = T(2 * 0.79788456080286535588), c = T(0.044715);
  return x * Sigmoid(k2 * x * Fma(c, x * x, T(1)));
}

// ---------------------------------------------------------------------------
// sin and cos of a float, evaluated in double (trigonometric.py's float32
// kernels, and fused runs).  x = n pi/2 + r, |r| <= pi/4: n is x 2/pi rounded
// (adding 1.5 * 2^52 rounds it), r comes from Cody and Waite's two-part pi/2,
// whose first part has 33 bits, so that n times it and the subtraction are
// exact for |x| <= 2^16 (n < 2^16) and r's error stays far below a float's
// ulp even next to a multiple of pi/2; then polynomials of sin r and cos r
// (to r^11 and r^10, fitted on |r| <= pi/4 for relative errors near 1e-14
// and 1e-13), n mod 4 choosing which and its sign.  (The polynomials are
// about two thirds of the time, the reduction a quarter, the conversions
// the rest.)  Plain multiplies and adds, no Fma: every ISA variant
// rounds alike.  The double result rounded to float is within 0.5 ulp and a
// hair.  Larger |x|, infinities and NaN go to libm.

// c0 z^k + ... + ck by Horner's rule without Fma.
template <typename T>
inline T PlainHorner(T, T c) { return c; }
template <typename T, typename... Rest>
inline T PlainHorner(T z, T c0, T c1, Rest... rest) { return PlainHorner(z, c0 * z + c1, T(rest)...); }

inline bool SinCosInRange(float x) { return Abs(x) <= 65536.0f; }  // (false for NaN)

// sin r and cos r into s and c, and n (in its low bits) into quadrant, for x = n pi/2 + r.
inline void SinCosReduced(double x, int64_t &quadrant, double &s, double &c) {
  const double t = x * 0.63661977236758134308 + 6755399441055744.0;  // x 2/pi, rounded in the low bits
  const double n = t - 6755399441055744.0;
  quadrant = Bits(t);
  const double r = (x - n * 1.5707963267341256) - n * 6.077100506506192e-11;
  const double z = r * r;
  const double ps = PlainHorner(z, -2.4805275454569255e-08, 2.7555986474143734e-06, -0.00019841266899785204,
                                0.008333333331057959, -0.16666666666663846);
  const double pc = PlainHorner(z, -2.7236344117694923e-07, 2.47998523514598e-05, -0.0013888885053388316,
                                0.041666666636925656, -0.4999999999996298);
  s = r + r * z * ps;
  c = 1.0 + z * pc;
}

template <bool kCosine>
inline float SinCosInDouble(float value) {
  int64_t n;
  double s, c;
  SinCosReduced(value, n, s, c);
  const int64_t quadrant = (n + (kCosine ? 1 : 0)) & 3;  // cos x = sin(x + pi/2): one quadrant on
  const double v = (quadrant & 1) ? c : s;
  const float result = static_cast<float>((quadrant & 2) ? -v : v);
  return !kCosine && value == 0.0f ? value : result;  // sin(-0.0) is -0.0 (the polynomial gives +0.0)
}

inline bool SinInRange(float x) { return SinCosInRange(x); }
inline bool CosInRange(float x) { return SinCosInRange(x); }
inline float SinInDouble(float x) { return SinCosInDouble<false>(x); }
inline float CosInDouble(float x) { return SinCosInDouble<true>(x); }

// ---------------------------------------------------------------------------
// tan, asin, acos, atan, sinh, cosh, asinh, acosh and atanh of a float,
// evaluated in double as sin and cos are: plain multiplies, adds, divisions
// and square roots (no Fma), so every ISA variant rounds alike, with errors
// near 1e-12 relative or less before the one rounding to float (within 0.5
// ulp and a hair).  The polynomials were fitted for opforge (least squares
// of the relative error at 40 digits, Chebyshev nodes), each as short as
// that accuracy allows.  NameInRange(x) says where NameInDouble(x) serves (false for NaN);
// libm takes the rest (infinities, NaN, out of the domain, overflow), so
// their special values are the C library's, as NumPy's are.

// tan = sin / cos from sin and cos's reduction: s / c, or -c / s in an odd quadrant.
inline bool TanInRange(float x) { return SinCosInRange(x); }
inline float TanInDouble(float value) {
  int64_t n;
  double s, c;
  SinCosReduced(value, n, s, c);
  const bool odd = n & 1;
  const float result = static_cast<float>((odd ? -c : s) / (odd ? s : c));
  return value == 0.0f ? value : result;  // tan(-0.0) is -0.0
}

// atan a = offset + atan t with |t| <= tan(pi/8): t = a up to tan(pi/8),
// (a - 1) / (a + 1) (offset pi/4) up to tan(3pi/8), -1 / a (offset pi/2)
// beyond; atan t = t + t z Q(z), z = t^2, Q fitted on z's range (relative
// error 6e-11, 3e-12 in atan t).
inline bool AtanInRange(float x) { return Abs(x) <= std::numeric_limits<float>::max(); }
inline float AtanInDouble(float value) {
  const double a = Abs(double(value));
  const bool small = a <= 0.41421356237309503, large = a > 2.4142135623730949;
  double num = small ? a : a - 1.0, den = small ? 1.0 : a + 1.0, offset = small ? 0.0 : 0.78539816339744831;
  num = large ? -1.0 : num;
  den = large ? a : den;
  offset = large ? 1.5707963267948966 : offset;
  const double t = num / den, z = t * t;
  const double q = PlainHorner(z, -0.04042616094786848, 0.07135077435234012, -0.09028953492647368,
                               0.1110749490532737, -0.14285612676606277, 0.1999999892568457, -0.3333333333153207);
  return CopySign(static_cast<float>(offset + (t + t * z * q)), value);
}

// asin s = s + s z R(z), z = s^2, for 0 <= s <= 1/2 (R fitted on z's range: relative error 8e-11, 4e-12 in
// asin s); a above
// 1/2 is reduced by asin a = pi/2 - 2 asin s, s = sqrt((1 - a) / 2), z = (1 - a) / 2 exact.
struct AsinParts {
  double p;    // asin s
  bool upper;  // a > 1/2: p is asin(sqrt((1 - a) / 2))
  explicit AsinParts(double a) {
    upper = a > 0.5;
    const double z = upper ? 0.5 - 0.5 * a : a * a;
    const double s = upper ? std::sqrt(z) : a;
    p = s + s * z * PlainHorner(z, 0.02928847673063449, 0.00545879209879228, 0.019300457527952418,
                                0.022133540278407176, 0.030397523470953574, 0.044642364192899256,
                                0.07500000585929066, 0.16666666665578578);
  }
};

inline bool AsinInRange(float x) { return Abs(x) <= 1.0f; }
inline float AsinInDouble(float value) {
  const AsinParts parts(Abs(double(value)));
  return CopySign(static_cast<float>(parts.upper ? 1.5707963267948966 - 2.0 * parts.p : parts.p), value);
}

// acos x = pi/2 - asin x for |x| <= 1/2, 2 asin s above, pi - 2 asin s below -1/2.
inline bool AcosInRange(float x) { return Abs(x) <= 1.0f; }
inline float AcosInDouble(float value) {
  const double x = value;
  const AsinParts parts(Abs(x));
  const double outer = x > 0.0 ? 2.0 * parts.p : 3.141592653589793 - 2.0 * parts.p;
  return static_cast<float>(parts.upper ? outer : 1.5707963267948966 - CopySign(parts.p, x));
}

// e^a = scale (1 + q) for 0 <= a <= 90 (no overflow in double): a = n ln2 +
// r, |r| <= ln2 / 2, ln2 in two parts, the first with few bits so that n
// times it is exact; q = e^r - 1 = r + r^2 E(r), E fitted on r's range
// (relative error 1e-12, 5e-14 in q).
inline double ExpM1Parts(double a, double &scale) {
  const double t = a * 1.4426950408889634 + 6755399441055744.0;  // a / ln2, rounded in the low bits
  const double n = t - 6755399441055744.0;
  scale = Pow2<double>(Bits(t) - Bits(6755399441055744.0));
  const double r = (a - n * Traits<double>::kLn2Hi) - n * Traits<double>::kLn2Lo;
  return r + r * r * PlainHorner(r, 2.7569830499834923e-06, 2.4867802918518738e-05, 0.00019841324870261776,
                                 0.0013888839231703484, 0.008333333284043258, 0.04166666678572053,
                                 0.16666666666752764, 0.4999999999995547);
}

// sinh a = (E + E / (E + 1)) / 2, E = e^a - 1 = scale q + (scale - 1): no cancellation near 0.  Up to 90,
// where the float result is inf from 89.42 on; beyond, libm.
inline bool SinhInRange(float x) { return Abs(x) <= 90.0f; }
inline float SinhInDouble(float value) {
  double scale;
  const double q = ExpM1Parts(Abs(double(value)), scale);
  const double e = scale * q + (scale - 1.0);
  return CopySign(static_cast<float>(0.5 * (e + e / (e + 1.0))), value);
}

inline bool CoshInRange(float x) { return Abs(x) <= 90.0f; }
inline float CoshInDouble(float value) {
  double scale;
  const double q = ExpM1Parts(Abs(double(value)), scale);
  const double e = scale + scale * q;
  return static_cast<float>(0.5 * e + 0.5 / e);
}

// log(1 + u) for u >= 0 finite, with one division: w = 1 + u rounded, c = u - (w - 1) what the rounding
// lost; w = 2^k m, m in [sqrt(1/2), sqrt(2)) (LogReduce), and f = m - 1 + c 2^-k (2^-k from the bits m and w
// differ by) carries c into log m = log1p(f) = f - (f^2/2 - s (f^2/2 + z P(z))), s = f / (2 + f), z = s^2,
// P fitted on z's range (relative error 1e-11, 2e-13 in log m).
inline double PlainLog1p(double u) {
  const double w = 1.0 + u, c = u - (w - 1.0);
  double m;
  const double k = LogReduce<false>(w, m);
  const double scale = FromBits<double>(Bits(m) - Bits(w) + Bits(1.0));
  const double f = (m - 1.0) + c * scale, s = f / (2.0 + f), z = s * s, h = 0.5 * f * f;
  const double p = PlainHorner(z, 0.1936247472086198, 0.22191412259380747, 0.2857175430941054,
                               0.39999998798764985, 0.666666666673737);
  return k * Traits<double>::kLn2Hi + ((f - (h - s * (h + z * p))) + k * Traits<double>::kLn2Lo);
}

// asinh a = log1p(a + a^2 / (1 + sqrt(1 + a^2))) (a^2 cannot overflow in double).
inline bool AsinhInRange(float x) { return Abs(x) <= std::numeric_limits<float>::max(); }
inline float AsinhInDouble(float value) {
  const double a = Abs(double(value)), square = a * a;
  return CopySign(static_cast<float>(PlainLog1p(a + square / (1.0 + std::sqrt(1.0 + square)))), value);
}

// acosh x = log1p(t + sqrt(t (t + 2))), t = x - 1 exact.
inline bool AcoshInRange(float x) { return x >= 1.0f && x <= std::numeric_limits<float>::max(); }
inline float AcoshInDouble(float value) {
  const double t = double(value) - 1.0;
  return static_cast<float>(PlainLog1p(t + std::sqrt(t * (t + 2.0))));
}

// atanh a = log1p(2a / (1 - a)) / 2, 1 - a exact; +-1 (inf) and beyond (NaN) are libm's.
inline bool AtanhInRange(float x) { return Abs(x) < 1.0f; }
inline float AtanhInDouble(float value) {
  const double a = Abs(double(value));
  return CopySign(static_cast<float>(0.5 * PlainLog1p(2.0 * a / (1.0 - a))), value);
}

// The elementwise forms (fused graphs call these): float in range from the
// above, the rest, and double, from libm.
#define VECMATH_FLOAT_IN_DOUBLE(Name, libm)                                                  \
  inline float Name(float x) { return Name##InRange(x) ? Name##InDouble(x) : std::libm(x); } \
  inline double Name(double x) { return std::libm(x); }
VECMATH_FLOAT_IN_DOUBLE(Sin, sin)
VECMATH_FLOAT_IN_DOUBLE(Cos, cos)
VECMATH_FLOAT_IN_DOUBLE(Tan, tan)
VECMATH_FLOAT_IN_DOUBLE(Asin, asin)
VECMATH_FLOAT_IN_DOUBLE(Acos, acos)
VECMATH_FLOAT_IN_DOUBLE(Atan, atan)
VECMATH_FLOAT_IN_DOUBLE(Sinh, sinh)
VECMATH_FLOAT_IN_DOUBLE(Cosh, cosh)
VECMATH_FLOAT_IN_DOUBLE(Asinh, asinh)
VECMATH_FLOAT_IN_DOUBLE(Acosh, acosh)
VECMATH_FLOAT_IN_DOUBLE(Atanh, atanh)
#undef VECMATH_FLOAT_IN_DOUBLE

// ---------------------------------------------------------------------------
// Array forms: y[i] = f(x[i]), i < n (x and y may be the same array).

#define VECMATH_ARRAY(Name, Fn)                                  \
  template <typename T>                                          \
  inline void Name(const T *x, T *y, int64_t n) {                \
    for (int64_t i = 0; i < n; i++) y[i] = Fn(x[i]);             \
  }
VECMATH_ARRAY(VecExp, Exp)
VECMATH_ARRAY(VecTanh, Tanh)
VECMATH_ARRAY(VecSigmoid, Sigmoid)
VECMATH_ARRAY(VecErf, Erf)
VECMATH_ARRAY(VecGelu, Gelu)
VECMATH_ARRAY(VecGeluTanh, GeluTanh)
#undef VECMATH_ARRAY
#undef VECMATH_INLINE

}  // namespace vecmath

#endif  // OPFORGE_BUILTINS_VECMATH_H_
