// Known-answer design 4: a generate loop of 3 submodule instances, each with its own register.
module lane (
  input  logic       clk,
  input  logic       en,
  input  logic [1:0] d,
  output logic [1:0] q
);
  always_ff @(posedge clk)
    if (en) q <= d;
endmodule

module gen_top #(parameter N = 3) (
  input  logic           clk,
  input  logic [N-1:0]   en,
  input  logic [1:0]     d,
  output logic [2*N-1:0] q
);
  genvar i;
  generate
    for (i = 0; i < N; i = i + 1) begin : g_lane
      wire [1:0] lq;
      lane u_lane (.clk(clk), .en(en[i]), .d(d), .q(lq));
      assign q[2*i +: 2] = lq;
    end
  endgenerate
endmodule
