// Operator schemas of the rh3dgs native core. Backends register implementations in
// csrc/cpu/*.cpp (CPU, always built) and csrc/cuda/*.cu (CUDA, built when available).
#include <Python.h>
#include <torch/library.h>

extern "C" {
// A minimal Python module so that `import rh3dgs._C` loads the library and runs the
// static registrations below; all functionality is reached through torch.ops.rh3dgs.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", "rh3dgs native ops (see torch.ops.rh3dgs)", -1, nullptr};
  return PyModule_Create(&module_def);
}
}

TORCH_LIBRARY(rh3dgs, m) {
  // Composite N-D features front to back over tile-sorted Gaussians.
  // means2d [B,N,2], conics [B,N,3], features [B,N,C], opacities [B,N], depths [B,N],
  // backgrounds [B,C] (optional), isect_offsets [B,TH,TW] int32, flatten_ids [M] int32.
  // Returns render [B,H,W,C], alpha [B,H,W], depth moments d1, d2 [B,H,W], last_ids [B,H,W] int32.
  m.def(
      "rasterize_fwd(Tensor means2d, Tensor conics, Tensor features, Tensor opacities, Tensor depths, "
      "Tensor? backgrounds, int width, int height, int tile_size, Tensor isect_offsets, Tensor flatten_ids) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  // rasterize_fwd that also records every (Gaussian, pixel) contribution it composites, one list per
  // tile (CPU kernel): its five outputs, then seg_offsets [tiles+1] int64 into segments [S,3] int32
  // (Gaussian index in [0, N), first pixel's flat index into [B,H,W], count) and pair_offsets
  // [tiles+1] int64 into lanes [P] uint8 (pixel = first + lane), weights [P] (alpha T) and masses [P]
  // (alpha), for aggregate_sphere_replay.
  m.def(
      "rasterize_record(Tensor means2d, Tensor conics, Tensor features, Tensor opacities, Tensor depths, "
      "Tensor? backgrounds, int width, int height, int tile_size, Tensor isect_offsets, Tensor flatten_ids) "
      "-> Tensor[]");
  // Gradients w.r.t. means2d, conics, features, opacities, depths. Only the first geometry_channels
  // feature channels (-1: all) pass their gradient on to the geometry (means2d, conics, opacities,
  // depths); the others' gradients reach their features only (as if the geometry were detached for them).
  m.def(
      "rasterize_bwd(Tensor means2d, Tensor conics, Tensor features, Tensor opacities, Tensor depths, "
      "Tensor? backgrounds, int width, int height, int tile_size, Tensor isect_offsets, Tensor flatten_ids, "
      "Tensor alpha, Tensor last_ids, Tensor v_render, Tensor v_alpha, Tensor v_d1, Tensor v_d2, "
      "int geometry_channels=-1) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  // EWA projection of 3D Gaussians into B pinhole cameras (gsplat's fully fused projection, non-packed):
  // means [N,3], quats [N,4] (w,x,y,z, any norm), scales [N,3] (activated), viewmats [B,4,4] (world to
  // camera), Ks [B,3,3]. Returns radii [B,N] int32 (0 = culled), means2d [B,N,2], depths [B,N],
  // conics [B,N,3]. CPU kernel; on CUDA rh3dgs.ops.project_gaussians calls gsplat's kernel.
  m.def("project_fwd(Tensor means, Tensor quats, Tensor scales, Tensor viewmats, Tensor Ks, int width, int height, "
        "float eps2d, float near_plane, float far_plane) -> (Tensor, Tensor, Tensor, Tensor)");
  // Gradients w.r.t. means, quats, scales and (if viewmats_grad, else zeros) viewmats; pairs with
  // radii <= 0 get none (as gsplat).
  m.def("project_bwd(Tensor means, Tensor quats, Tensor scales, Tensor viewmats, Tensor Ks, int width, int height, "
        "float eps2d, Tensor radii, Tensor v_means2d, Tensor v_depths, Tensor v_conics, bool viewmats_grad) "
        "-> (Tensor, Tensor, Tensor, Tensor)");
  // View-dependent colours from SH coefficients (gsplat's bases, degree 0-3, no +0.5 / clamp):
  // colors [B,N,3] = sum_k Y_k(normalise(means[n] - campos[b])) coeffs[n,k]; means [N,3], campos [B,3],
  // coeffs [N,K,3] with K >= (degree+1)^2. CPU kernel (forward; rh3dgs.ops.sh_colors differentiates
  // through its torch reference); on CUDA rh3dgs.ops.sh_colors calls gsplat's kernel.
  m.def("sh_fwd(int degree, Tensor means, Tensor campos, Tensor coeffs) -> Tensor");
  // Tile binning (gsplat's isect_tiles + isect_offset_encode, non-packed), CPU kernel;
  // on CUDA rh3dgs.ops.isect_tiles calls gsplat's kernels.
  // Returns tiles_per_gauss [B,N] int32, isect_offsets [B,TH,TW] int32, flatten_ids [M] int32.
  m.def("isect_tiles(Tensor means2d, Tensor radii, Tensor depths, int tile_size, int tile_width, int tile_height) "
        "-> (Tensor, Tensor, Tensor)");
  // One pass of the per-Gaussian robust spherical mean (training-free lift).
  // For every contribution w = alpha_i T_i(u) * pixel_weights(u) of Gaussian i to pixel u
  // with unit teacher feature z(u) (pixel_feats [B,H,W,D]):
  //   mode 0 (init):  acc_w[i] += w,  acc_v[i] += w z(u)
  //   mode 1 (IRLS):  theta = d(mu_i, z), omega = w * min(1, delta / theta),
  //                   acc_w[i] += omega, acc_v[i] += omega Log_{mu_i}(z(u))
  // Gaussians are indexed modulo N (flatten_ids % N), mu [N,D].
  // Returns acc_w [N], acc_v [N,D], and acc_raw [N] = sum of alpha_i(u) * pixel_weights(u) over the
  // same contributions (no transmittance): acc_w / acc_raw (init) is the Gaussian's mean transmittance
  // where it composites onto weighted pixels.
  m.def(
      "aggregate_sphere(Tensor means2d, Tensor conics, Tensor opacities, Tensor pixel_feats, "
      "Tensor pixel_weights, Tensor mu, float delta, int mode, int num_gaussians, int tile_size, "
      "Tensor isect_offsets, Tensor flatten_ids) -> (Tensor, Tensor, Tensor)");
  // aggregate_sphere over contributions recorded by rasterize_record instead of a traversal: R >= 1
  // recordings (list i: recording i's six tensors, and pixel_feats [B_i,H_i,W_i,D] and pixel_weights
  // [B_i,H_i,W_i] of its views), any mu [N,D]. One recording: bit-identical to aggregate_sphere on its
  // views with as many threads; several: the sum of theirs (each thread's sums added in list order).
  // active [num_gaussians] bool (optional): the contributions of Gaussians with active False are
  // skipped (their sums are 0; the rest unchanged, bit for bit).
  m.def(
      "aggregate_sphere_replay(Tensor[] seg_offsets, Tensor[] pair_offsets, Tensor[] segments, Tensor[] lanes, "
      "Tensor[] weights, Tensor[] masses, Tensor[] pixel_feats, Tensor[] pixel_weights, Tensor mu, float delta, "
      "int mode, Tensor? active=None) -> (Tensor, Tensor, Tensor)");
  // Relevancy of latent rows f [P, d] for folded queries pos [Q, d] against folded negatives
  // neg [J, d], with R [r, d] (R^T R = decoder^T decoder, so |decoder f| = |R f|):
  //   rel[p, q] = sigmoid(tau (cos(q, f) - max_j cos(neg_j, f))), cos(x, f) = <x, f> / |R f|.
  // Returns [P, Q]. CPU kernel; elsewhere rh3dgs.ops.relevancy runs its torch reference.
  m.def("relevancy(Tensor latents, Tensor pos, Tensor neg, Tensor norm_factor, float temperature) -> Tensor");
  // Joint bilateral upsampling of B coarse maps [B, h, w, D] to the guide images' [H, W] (guide [B, H, W, 3],
  // cell_colors [B, h, w, 3] = the mean guide colour of each cell's footprint): each pixel takes the cells of
  // the (2 radius + 1)^2 neighbourhood of its own cell, weighted by distance and colour match, normalised;
  // 0 where the weights sum below min_support. Returns [B, H, W, D]. CPU kernel; elsewhere
  // rh3dgs.ops.guided_upsample runs its torch reference.
  m.def("guided_upsample(Tensor map, Tensor guide, Tensor cell_colors, float sigma_color, float sigma_space, "
        "int radius, float min_support) -> Tensor");
  // LIC multi-positive InfoNCE over sampled anchors (rh3dgs.lic). features [N, d] (not normalised:
  // f = x / max(|x|, 1e-12) inside), anchors [A] int64, candidates [A, K] int64, kinds [A, K] uint8:
  // 0 = ignored (its candidate index is not read), 1 = negative, 2 = positive. With s = <f_a, f_j> / tau:
  //   loss[a] = log sum_{kind > 0} exp(s_aj) - mean_{kind = 2} s_aj   (0 without positives).
  // Returns loss [A] and, for the backward, anchor_feats [A, d] = f_a, d_sim [A, K] =
  // dloss_a / d<f_a, f_j> (0 where ignored or without positives) and d_anchor [A, d] =
  // sum_k d_sim[a, k] f_j (= dloss_a / df_a). Order: (loss, anchor_feats, d_anchor, d_sim).
  m.def("lic_infonce_fwd(Tensor features, Tensor anchors, Tensor candidates, Tensor kinds, float inv_temperature) "
        "-> (Tensor, Tensor, Tensor, Tensor)");
  // LIC's pull form on the same inputs: loss[a] = 1 - mean_{kind = 2} <f_a, f_j> (0 without positives; kind 1
  // entries are not read). Returns what lic_infonce_fwd returns, for the same backward: d_sim = -1 / |P| on
  // the positives (0 elsewhere), d_anchor = -mean_{kind = 2} f_j. CPU kernel; elsewhere rh3dgs.ops.lic_pull runs
  // its torch reference.
  m.def("lic_pull_fwd(Tensor features, Tensor anchors, Tensor candidates, Tensor kinds) "
        "-> (Tensor, Tensor, Tensor, Tensor)");
  // dL/dfeatures [N, d] from grad_loss [A] = dL/dloss and the forward's saved outputs (either forward).
  m.def("lic_infonce_bwd(Tensor features, Tensor anchors, Tensor candidates, Tensor kinds, Tensor anchor_feats, "
        "Tensor d_anchor, Tensor d_sim, Tensor grad_loss) -> Tensor");
}
