// Adds AVX-512 VNNI to the functions that follow on Highway's AVX3_DL target. Include it right after
// HWY_BEFORE_NAMESPACE() (no include guard: once per target of foreach_target).
//
// Highway 1.0.3's AVX3_DL target string names "avxvnni" (VEX) rather than "avx512vnni"; its run-time
// check for AVX3_DL does require AVX512_VNNI (CPUID.7.0:ECX[11]), so enabling it here is safe.
#if HWY_TARGET == HWY_AVX3_DL
#if defined(__clang__)
// clang honours only the first target attribute of a function: HWY_BEFORE_NAMESPACE's is replaced by
// the same string plus VNNI (HWY_AFTER_NAMESPACE pops this one).
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wpragma-clang-attribute"
#pragma clang attribute pop
#pragma clang diagnostic pop
#pragma clang attribute push(__attribute__((target(HWY_TARGET_STR ",avx512vnni"))), apply_to = function)
#else
#pragma GCC target("avx512vnni")
#endif
#endif
