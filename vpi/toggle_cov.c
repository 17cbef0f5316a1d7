/* toggle_cov.c: chorus-mini's VPI toggle backend for sim.py (built with iverilog-vpi at first use).
 *
 * Same definition as the pure-Verilog toggle monitors (instrument.py, _toggle_monitor): a bit is covered
 * once it went 0->1 and 1->0 between END-OF-TIMESTEP values (X/Z never count; the value at the end of
 * time 0 is the starting value). Per signal a value-change callback keeps the latest value; the first
 * change in a new time step commits the previous step's last value against the value committed before
 * it, as the Verilog monitor does, but without a $realtime call per wake-up (the callback carries the
 * time). A signal whose bits have all risen and fallen drops its callback.
 *
 *   initial $__cv_toggle(group, sig0, rise0, fall0, sig1, rise1, fall1, ...);   group: an integer reg
 *   final   $__cv_toggle_end(group);     commits the last step and writes rise/fall into the regs
 */
#include <stdlib.h>
#include <string.h>
#include <vpi_user.h>

typedef struct {
    vpiHandle sig, rise_reg, fall_reg, cb;
    int width, words;
    PLI_UINT64 step;                 /* time of the step whose last value is la/lb */
    PLI_UINT32 *pa, *pb, *la, *lb;   /* committed previous value, latest value (aval/bval words) */
    PLI_UINT32 *rise, *fall;
} Sig;

typedef struct {
    int n;
    Sig *sigs;
} Group;

static Group *groups;
static int n_groups;

static PLI_UINT64 now_of(p_vpi_time t) {
    return ((PLI_UINT64)t->high << 32) | t->low;
}

static PLI_UINT32 top_mask(const Sig *s, int w) {
    int r = s->width % 32;
    return (w == s->words - 1 && r) ? ((1u << r) - 1) : 0xffffffffu;
}

static void copy_value(Sig *s, p_vpi_vecval v) {
    for (int w = 0; w < s->words; w++) {
        s->la[w] = v[w].aval;
        s->lb[w] = v[w].bval;
    }
}

/* rise |= (prev known 0) & (last known 1); fall |= (prev known 1) & (last known 0); returns 1 if saturated */
static int commit(Sig *s) {
    int full = 1;
    for (int w = 0; w < s->words; w++) {
        PLI_UINT32 m = top_mask(s, w);
        PLI_UINT32 p0 = ~s->pa[w] & ~s->pb[w], p1 = s->pa[w] & ~s->pb[w];
        PLI_UINT32 l0 = ~s->la[w] & ~s->lb[w], l1 = s->la[w] & ~s->lb[w];
        s->rise[w] |= p0 & l1 & m;
        s->fall[w] |= p1 & l0 & m;
        s->pa[w] = s->la[w];
        s->pb[w] = s->lb[w];
        if ((s->rise[w] & s->fall[w]) != m)
            full = 0;
    }
    return full;
}

static PLI_INT32 on_change(p_cb_data d) {
    Sig *s = (Sig *)d->user_data;
    PLI_UINT64 now = now_of(d->time);
    if (now != s->step) {
        s->step = now;
        if (commit(s)) {
            vpi_remove_cb(s->cb);
            s->cb = NULL;
            return 0;
        }
    }
    copy_value(s, d->value->value.vector);
    return 0;
}

static PLI_INT32 toggle_calltf(PLI_BYTE8 *unused) {
    (void)unused;
    vpiHandle call = vpi_handle(vpiSysTfCall, NULL);
    vpiHandle args = vpi_iterate(vpiArgument, call);
    vpiHandle group_reg = vpi_scan(args), a;
    vpiHandle handles[3 * 4096];
    int n = 0;
    while ((a = vpi_scan(args)) != NULL) {
        if (n >= 3 * 4096) {
            vpi_printf("toggle_cov: too many signals in one scope\n");
            vpi_control(vpiFinish, 1);
            vpi_free_object(args);
            return 0;
        }
        handles[n++] = a;
    }
    Group g = {n / 3, calloc(n / 3 + 1, sizeof(Sig))};
    s_vpi_time t = {vpiSimTime, 0, 0, 0.0};
    vpi_get_time(NULL, &t);
    for (int i = 0; i < g.n; i++) {
        Sig *s = &g.sigs[i];
        s->sig = handles[3 * i];
        s->rise_reg = handles[3 * i + 1];
        s->fall_reg = handles[3 * i + 2];
        s->width = vpi_get(vpiSize, s->sig);
        s->words = (s->width + 31) / 32;
        PLI_UINT32 *mem = calloc(6 * (size_t)s->words, sizeof(PLI_UINT32));
        s->pa = mem; s->pb = mem + s->words; s->la = mem + 2 * s->words; s->lb = mem + 3 * s->words;
        s->rise = mem + 4 * s->words; s->fall = mem + 5 * s->words;
        /* nothing committed yet: the Verilog monitor's register before its first commit, i.e. X for a 4-state
           type and 0 for a 2-state one; the rise register has that type and is still untouched, so copy it */
        s_vpi_value r = {vpiVectorVal, {0}};
        vpi_get_value(s->rise_reg, &r);
        for (int w = 0; w < s->words; w++) {
            s->pa[w] = r.value.vector[w].aval;
            s->pb[w] = r.value.vector[w].bval;
        }
        s->step = now_of(&t);
        s_vpi_value v = {vpiVectorVal, {0}};
        vpi_get_value(s->sig, &v);
        copy_value(s, v.value.vector);
        static s_vpi_time cb_time = {vpiSimTime, 0, 0, 0.0};
        static s_vpi_value cb_value = {vpiVectorVal, {0}};
        s_cb_data cb = {cbValueChange, on_change, s->sig, &cb_time, &cb_value, 0, (PLI_BYTE8 *)s};
        s->cb = vpi_register_cb(&cb);
    }
    groups = realloc(groups, (size_t)(n_groups + 1) * sizeof(Group));
    groups[n_groups] = g;
    s_vpi_value idx = {vpiIntVal, {0}};
    idx.value.integer = n_groups++;
    vpi_put_value(group_reg, &idx, NULL, vpiNoDelay);
    return 0;
}

static void put_bits(vpiHandle reg, const PLI_UINT32 *bits, int words) {
    s_vpi_vecval *vec = calloc((size_t)words, sizeof(s_vpi_vecval));
    for (int w = 0; w < words; w++)
        vec[w].aval = bits[w];
    s_vpi_value v = {vpiVectorVal, {0}};
    v.value.vector = vec;
    vpi_put_value(reg, &v, NULL, vpiNoDelay);
    free(vec);
}

static PLI_INT32 toggle_end_calltf(PLI_BYTE8 *unused) {
    (void)unused;
    vpiHandle call = vpi_handle(vpiSysTfCall, NULL);
    vpiHandle args = vpi_iterate(vpiArgument, call);
    vpiHandle group_reg = vpi_scan(args);
    vpi_free_object(args);
    s_vpi_value idx = {vpiIntVal, {0}};
    vpi_get_value(group_reg, &idx);
    if (idx.value.integer < 0 || idx.value.integer >= n_groups)
        return 0;
    Group *g = &groups[idx.value.integer];
    for (int i = 0; i < g->n; i++) {
        Sig *s = &g->sigs[i];
        if (s->cb != NULL) {             /* the last time step (a saturated signal has nothing left) */
            commit(s);
            vpi_remove_cb(s->cb);
            s->cb = NULL;
        }
        put_bits(s->rise_reg, s->rise, s->words);
        put_bits(s->fall_reg, s->fall, s->words);
    }
    return 0;
}

static void register_tasks(void) {
    s_vpi_systf_data tf = {vpiSysTask, 0, "$__cv_toggle", toggle_calltf, NULL, NULL, NULL};
    vpi_register_systf(&tf);
    s_vpi_systf_data te = {vpiSysTask, 0, "$__cv_toggle_end", toggle_end_calltf, NULL, NULL, NULL};
    vpi_register_systf(&te);
}

void (*vlog_startup_routines[])(void) = {register_tasks, NULL};
