// Harness fixture: two clock domains, each with its own active-low reset and a toggle-synchroniser.
module two_clk (
  input  logic       clk_a,
  input  logic       clk_b,
  input  logic       rst_a_n,
  input  logic       rst_b_n,
  input  logic       req,
  input  logic [2:0] data,
  output logic       ack,
  output logic [2:0] seen
);
  logic tog_a, s1, s2, s3;
  always_ff @(posedge clk_a or negedge rst_a_n) begin
    if (!rst_a_n)  tog_a <= 1'b0;
    else if (req)  tog_a <= ~tog_a;
  end
  always_ff @(posedge clk_b or negedge rst_b_n) begin
    if (!rst_b_n) begin
      {s1, s2, s3} <= 3'b000;
      seen <= 3'd0;
    end else begin
      s1 <= tog_a; s2 <= s1; s3 <= s2;
      if (s2 ^ s3) seen <= data;
    end
  end
  assign ack = s2 ^ s3;
endmodule
